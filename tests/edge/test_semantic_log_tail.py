"""The semantic cache's log tail on a busy machine: a tailing read that comes back after the
Redis socket timeout is not an outage (the log stays in sync, nothing is logged as unavailable);
reads that time out again and again are one. Redis is a stand-in here (it only answers
``xread``), because the point is the timing of its answers, which a real server on an idle
machine never shows."""

from __future__ import annotations

import asyncio
import logging

from redis.exceptions import TimeoutError as RedisTimeout

from dataplane.edge.semantic_cache import FOLLOW_LATE_READS, SemanticCache


class LateRedis:
    """Answers the replay at once, then times out ``late`` tailing reads in a row, then answers."""

    def __init__(self, late: int) -> None:
        self.late, self.calls = late, 0

    async def xread(self, streams, count=None, block=None):
        self.calls += 1
        if block is None:
            return []  # replay: the log is empty
        if self.late > 0:
            self.late -= 1
            raise RedisTimeout("Timeout reading from socket")
        await asyncio.sleep(0.01)
        return []


class NoModel:
    """No embedding model: only the log tail runs here."""

    def close(self) -> None:
        pass


async def tail(late: int, caplog) -> SemanticCache:
    cache = SemanticCache(LateRedis(late), answers=None, embedder=NoModel(), prefix="t:", region="r", retry_s=0.01)
    with caplog.at_level(logging.WARNING, logger="nimbus.edge.semantic"):
        await cache.start()
        await asyncio.sleep(0.3)
        await cache.stop()
    return cache


async def test_a_late_answer_on_a_quiet_log_is_not_an_outage(caplog) -> None:
    cache = await tail(FOLLOW_LATE_READS - 1, caplog)
    assert cache.synced.is_set()
    assert "log unavailable" not in caplog.text


async def test_reads_that_keep_timing_out_are_an_outage(caplog) -> None:
    await tail(FOLLOW_LATE_READS, caplog)
    assert "log unavailable" in caplog.text
