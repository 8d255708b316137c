"""Which ``infra`` provider serves each cloud, built from settings.

Services take a ``Providers`` (cloud name → provider) instead of building clients
themselves, so tests inject emulator-backed providers and production gets the real
ones from configuration.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from controlplane.config import Settings
from infra.provider import Provider
from infra.registry import get_provider

Providers = Callable[[str], Provider]


class SettingsProviders:
    """Lazily builds (and keeps) one provider per cloud from ``Settings``.

    Clients are created on first use, so a deployment that only uses AWS never loads
    the GCP SDK. Thread-safe: Celery may run tasks in threads.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._built: dict[str, Provider] = {}
        self._lock = threading.Lock()

    def __call__(self, cloud: str) -> Provider:
        with self._lock:
            if cloud not in self._built:
                self._built[cloud] = get_provider(cloud, **self._config(cloud))
            return self._built[cloud]

    def _config(self, cloud: str) -> dict[str, Any]:
        s = self._settings
        if cloud == "aws":
            return {"endpoint_url": s.aws_endpoint_url} if s.aws_endpoint_url else {}
        if cloud == "gcp":
            if not s.gcp_project:
                raise ValueError("set NIMBUS_GCP_PROJECT to launch on GCP")
            config: dict[str, Any] = {"project": s.gcp_project}
            if s.gcp_endpoint_url:
                config["client_options"] = {"api_endpoint": s.gcp_endpoint_url}
            return config
        if cloud == "local":
            config = {"state_dir": s.state_dir / "local-cloud"}
            if s.local_agent_command:
                config["command"] = list(s.local_agent_command)
            return config
        raise ValueError(f"unknown cloud {cloud!r}")
