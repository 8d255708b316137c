"""The Celery app: broker from settings, late acks, one message at a time, and the beat schedule.

Production uses Redis (``NIMBUS_BROKER_URL``); with no broker configured the embedded
mode uses kombu's filesystem transport under ``state_dir``. ``task_acks_late`` plus
``task_reject_on_worker_lost`` put a message back when its worker dies mid-task; the
tasks are idempotent (leases, idempotency tokens), so running one twice is harmless.

Start a worker:  ``celery -A controlplane.tasks.app worker --pool=solo``
and beat:        ``celery -A controlplane.tasks.app beat``.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from controlplane.config import Settings
from controlplane.tasks import runtime

TASK_MODULES = ["controlplane.tasks.provisioning", "controlplane.tasks.usage", "controlplane.tasks.autoscale",
                "controlplane.tasks.batches"]
# Long work gets its own queue and worker (``celery worker -Q batches``), so the fleet's ticks never
# wait behind it.
TASK_ROUTES = {"nimbus.run_batches": {"queue": "batches"}}


def broker_settings(settings: Settings) -> dict[str, Any]:
    if settings.broker_url:
        options: dict[str, Any] = {}
        if settings.celery_key_prefix:
            options["global_keyprefix"] = settings.celery_key_prefix
        return {"broker_url": settings.broker_url, "broker_transport_options": options}
    folder = (settings.state_dir / "broker").resolve()
    for sub in ("queue", "processed", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return {
        "broker_url": "filesystem://",
        "broker_transport_options": {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
            # Exchange tables (pidbox broadcasts) would otherwise land in the working directory.
            "control_folder": str(folder / "control"),
        },
    }


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    tick = settings.reconcile_interval_s
    schedule = {
        "reconcile": {"task": "nimbus.reconcile", "schedule": tick, "options": {"expires": tick * 2}},
        "dispatch-operations": {"task": "nimbus.dispatch_operations", "schedule": tick, "options": {"expires": tick * 2}},
        "sweep": {"task": "nimbus.sweep", "schedule": settings.sweep_interval_s,
                  "options": {"expires": settings.sweep_interval_s}},
        "rollup-usage": {"task": "nimbus.rollup_usage", "schedule": settings.usage_rollup_interval_s,
                         "options": {"expires": settings.usage_rollup_interval_s * 2}},
        "run-batches": {"task": "nimbus.run_batches", "schedule": settings.batch_interval_s,
                        "options": {"expires": settings.batch_interval_s * 2, "queue": "batches"}},
    }
    if settings.autoscaler_enabled:
        schedule["autoscale"] = {"task": "nimbus.autoscale", "schedule": settings.autoscale_interval_s,
                                 "options": {"expires": settings.autoscale_interval_s * 2}}
    return schedule


def configure_app(app: Celery, settings: Settings) -> Celery:
    app.conf.update(
        **broker_settings(settings),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        result_backend=None,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
        beat_schedule=beat_schedule(settings),
        task_routes=TASK_ROUTES,
        worker_hijack_root_logger=False,
    )
    return app


def make_app(settings: Settings | None = None) -> Celery:
    app = Celery("nimbus", include=TASK_MODULES)
    return configure_app(app, settings or runtime.settings())


app = make_app()
