"""A real Celery worker and beat in this process, on the real Redis broker (per-test key prefix)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import kombu.pools
from celery.beat import EmbeddedService
from celery.contrib.testing.worker import start_worker

from controlplane.config import Settings
from controlplane.tasks import runtime
from controlplane.tasks.app import app, configure_app


def use_broker(settings: Settings) -> None:
    """Point the module-level app at this test's broker settings (its own Redis key prefix).

    Producers and connections pooled under an earlier test's settings would keep publishing
    with the old prefix, so the pools are dropped first.
    """
    app.close()
    app.amqp._producer_pool = None
    kombu.pools.reset()
    configure_app(app, settings)


@contextmanager
def celery_running(settings: Settings, providers, schedule_dir: Path, *, beat: bool = True) -> Iterator[None]:
    import controlplane.tasks.provisioning
    import controlplane.tasks.usage  # noqa: F401

    use_broker(settings)
    runtime.configure(settings, providers)
    beat_service = EmbeddedService(app, thread=True, schedule_filename=str(schedule_dir / "beat-schedule"))
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=15, loglevel="WARNING"):
            if beat:
                beat_service.start()
            try:
                yield
            finally:
                if beat:
                    beat_service.stop()
    finally:
        runtime.configure(None, None)
        app.close()
