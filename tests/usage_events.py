"""The usage events in a Redis stream, in order, as the control plane's roll-up reads them (an
entry carries a batch of events; ``controlplane.services.usage_rollup.events_of``)."""

from __future__ import annotations

from controlplane.services.usage_rollup import events_of


def stream_events(client, stream: str) -> list[dict[str, str]]:
    """Every event of ``stream`` (a sync client, decoding responses or not), oldest first."""
    return [ev for _, fields in client.xrange(stream) for ev in events_of(fields)]


async def stream_events_async(client, stream: str) -> list[dict[str, str]]:
    return [ev for _, fields in await client.xrange(stream) for ev in events_of(fields)]
