"""cloud-init user data: valid, carries only the one-time token, fits the clouds."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from infra.bootstrap import (
    AGENT_CONFIG_PATH,
    AGENT_UNIT,
    AGENT_UNIT_PATH,
    USER_DATA_LIMITS,
    AgentConfig,
    AgentInstall,
    UserDataError,
    find_secret_args,
    parse_user_data,
    render_user_data,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def config(**kw) -> AgentConfig:
    base = AgentConfig(
        control_plane_url="https://cp.nimbus.example.internal",
        node_id="node-0b7e",
        bootstrap_token="bt_8f2c1d9e7a",
        bootstrap_token_expires_at=NOW + timedelta(minutes=15),
        variant="llama-3.1-70b-instruct:fp8",
        engine="sglang",
        engine_args=("--tp-size", "4", "--mem-fraction-static", "0.85", "--max-total-tokens", "200000"),
        cluster="prod",
        pool_id="pool-3",
        cloud="aws",
        region="us-east-1",
        zone="us-east-1a",
        artifact_source="s3://nimbus-artifacts-us-east-1",
    )
    return replace(base, **kw)


def test_renders_valid_cloud_config_that_writes_config_and_starts_the_unit():
    text = render_user_data(config(), cloud="aws", now=NOW)
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    files = {f["path"]: f for f in doc["write_files"]}
    assert files[AGENT_CONFIG_PATH]["permissions"] == "0600"
    assert AgentConfig.from_json(files[AGENT_CONFIG_PATH]["content"]) == config()
    unit = files[AGENT_UNIT_PATH]["content"]
    assert f"ExecStart={AgentInstall().agent_bin} --config {AGENT_CONFIG_PATH}" in unit
    assert "Restart=always" in unit
    assert ["systemctl", "enable", "--now", AGENT_UNIT] in doc["runcmd"]
    assert ["mkdir", "-p", "/var/lib/nimbus/artifacts", "/var/lib/nimbus/models"] in doc["runcmd"]
    install = next(c for c in doc["runcmd"] if c[0] == "sh")
    assert "pip install" in install[2] and "test -x /opt/nimbus/venv/bin/nimbus-agent" in install[2]


def test_round_trips_through_parse_user_data():
    cfg = config()
    assert parse_user_data(render_user_data(cfg, cloud="gcp", now=NOW)) == cfg
    assert parse_user_data("#!/bin/sh\necho hi\n") is None
    assert parse_user_data("#cloud-config\nruncmd: [[echo, hi]]\n") is None


def test_the_bootstrap_token_is_the_only_credential():
    text = render_user_data(config(), cloud="aws", now=NOW)
    assert text.count("bt_8f2c1d9e7a") == 1
    doc = yaml.safe_load(text)
    agent = AgentConfig.from_json(doc["write_files"][0]["content"])
    credential_fields = [f for f in vars(agent) if any(w in f for w in ("token", "secret", "key", "password"))]
    assert credential_fields == ["bootstrap_token", "bootstrap_token_expires_at"]


@pytest.mark.parametrize("args", [("--api-key", "sk-live"), ("--api-key=sk-live",), ("--hf-token", "hf_x"), ("--aws-secret-access-key", "x")])
def test_refuses_long_lived_secrets_in_engine_args(args):
    with pytest.raises(UserDataError, match="credentials"):
        render_user_data(config(engine_args=args), cloud="aws", now=NOW)


def test_secret_detection_is_word_wise():
    assert find_secret_args(["--max-total-tokens", "1", "--max-prefill-tokens", "2", "--tp-size", "4"]) == []
    assert find_secret_args(["--admin-api-key=x", "--token"]) == ["--admin-api-key", "--token"]


def test_bootstrap_token_must_be_short_lived():
    with pytest.raises(UserDataError, match="TTL"):
        render_user_data(config(bootstrap_token_expires_at=NOW + timedelta(days=30)), cloud="aws", now=NOW)
    with pytest.raises(UserDataError, match="TTL"):
        render_user_data(config(bootstrap_token_expires_at=NOW - timedelta(seconds=1)), cloud="aws", now=NOW)
    with pytest.raises(UserDataError, match="required"):
        render_user_data(config(bootstrap_token=""), cloud="aws", now=NOW)


def test_size_is_checked_against_each_clouds_limit():
    text = render_user_data(config(), cloud="aws", now=NOW)
    assert len(text.encode()) < USER_DATA_LIMITS["aws"] == 16 * 1024
    big = config(engine_args=tuple(f"--flag-{i}" for i in range(2000)))
    with pytest.raises(UserDataError, match="aws accepts at most 16384"):
        render_user_data(big, cloud="aws", now=NOW)
    assert len(render_user_data(big, cloud="gcp", now=NOW).encode()) > 16 * 1024  # GCE allows 256 KB
    with pytest.raises(UserDataError):
        render_user_data(config(), cloud="azure", now=NOW)


def test_shell_metacharacters_in_package_are_quoted():
    text = render_user_data(config(), cloud="aws", now=NOW, install=AgentInstall(package="nimbus; rm -rf /"))
    install = next(c for c in yaml.safe_load(text)["runcmd"] if c[0] == "sh")
    assert "'nimbus; rm -rf /'" in install[2]
