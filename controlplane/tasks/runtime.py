"""What tasks run against: settings and cloud providers, replaceable in tests and by the CLI.

Workers read ``NIMBUS_*`` settings and build real providers from them; an embedding
process (the embedded mode, the tests) may ``configure`` both before tasks run.
"""

from __future__ import annotations

from controlplane.config import Settings, get_settings
from controlplane.fleet.clouds import Providers, SettingsProviders

_settings: Settings | None = None
_providers: Providers | None = None


def configure(settings: Settings | None = None, providers: Providers | None = None) -> None:
    global _settings, _providers
    _settings, _providers = settings, providers


def settings() -> Settings:
    return _settings or get_settings()


def providers() -> Providers:
    global _providers
    if _providers is None:
        _providers = SettingsProviders(settings())
    return _providers
