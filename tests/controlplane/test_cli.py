"""The `nimbus` CLI: migrations and catalog import, including the samples Terraform produces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, func, select

from controlplane.cli import main
from controlplane.config import get_settings
from controlplane.models import InstanceType, Region

ENVIRONMENTS = Path(__file__).resolve().parents[2] / "terraform" / "environments"


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    """Point the CLI at a throw-away embedded (SQLite) database."""
    monkeypatch.setenv("NIMBUS_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("NIMBUS_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    runner = CliRunner()
    result = runner.invoke(main, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    yield runner, f"sqlite:///{tmp_path / 'nimbus.db'}"
    get_settings.cache_clear()


@pytest.mark.parametrize("env", ["aws", "gcp", "multicloud"])
def test_terraform_sample_catalog_imports_cleanly(cli_env, env) -> None:
    runner, url = cli_env
    sample = ENVIRONMENTS / env / "catalog.sample.json"
    doc = json.loads(sample.read_text())
    result = runner.invoke(main, ["catalog", "import", str(sample)])
    assert result.exit_code == 0, result.output
    engine = create_engine(url)
    with engine.connect() as conn:
        regions = conn.scalar(select(func.count()).select_from(Region))
        types = conn.scalar(select(func.count()).select_from(InstanceType))
    engine.dispose()
    assert regions == sum(len(c["regions"]) for c in doc["clouds"])
    assert types == sum(len(r["instance_types"]) for c in doc["clouds"] for r in c["regions"])
    # importing twice changes nothing
    again = runner.invoke(main, ["catalog", "import", str(sample)])
    assert again.exit_code == 0 and "removed" not in again.output


def test_invalid_catalog_is_rejected_with_field_errors(cli_env, tmp_path) -> None:
    runner, _ = cli_env
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "clouds": [{"name": "azure", "regions": []}]}))
    result = runner.invoke(main, ["catalog", "import", str(bad)])
    assert result.exit_code == 2
    assert "clouds/0/name" in result.output
