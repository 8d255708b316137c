"""A real Celery worker and beat in this process, on the real Redis broker (per-test key prefix)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from celery.beat import EmbeddedService
from celery.contrib.testing.worker import start_worker

from controlplane.config import Settings
from controlplane.tasks import runtime
from controlplane.tasks.app import app, configure_app


@contextmanager
def celery_running(settings: Settings, providers, schedule_dir: Path, *, beat: bool = True) -> Iterator[None]:
    import controlplane.tasks.provisioning
    import controlplane.tasks.usage  # noqa: F401

    app.close()  # drop connections made for an earlier test's broker settings
    configure_app(app, settings)
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
