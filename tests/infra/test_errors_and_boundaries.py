"""Retry/backoff behaviour, error scopes, the registry and the package boundary."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import infra
from infra.errors import (
    CapacityError,
    ConfigError,
    ProviderError,
    QuotaError,
    RetryPolicy,
    TransientError,
    retry,
)
from infra.local import LocalProvider
from infra.provider import Provider
from infra.registry import get_provider

INFRA = Path(infra.__file__).parent


def test_default_scopes():
    assert CapacityError("x").scope == "zone"
    assert QuotaError("x").scope == "region"
    assert QuotaError("x", scope="cloud").scope == "cloud"
    assert ConfigError("x").scope == "cloud"
    assert TransientError("x").scope == "none"
    assert ProviderError("x").scope == "zone"
    with pytest.raises(ValueError):
        ProviderError("x", scope="galaxy")  # type: ignore[arg-type]


def test_retry_backs_off_exponentially_with_cap_and_jitter():
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 5:
            raise TransientError("throttled", code="RequestLimitExceeded")
        return "ok"

    policy = RetryPolicy(attempts=5, base_delay=1.0, max_delay=3.0)
    assert retry(flaky, policy, sleep=sleeps.append, rand=lambda: 0.5) == "ok"
    assert sleeps == [0.5, 1.0, 1.5, 1.5]  # 0.5 × min(3, 1, 2, 4, 8)


def test_retry_gives_up_with_the_last_transient_error():
    sleeps = []

    def always():
        raise TransientError("still throttled", code="Throttling")

    with pytest.raises(TransientError, match="still throttled"):
        retry(always, RetryPolicy(attempts=3), sleep=sleeps.append, rand=lambda: 1.0)
    assert len(sleeps) == 2


def test_retry_does_not_retry_other_errors():
    calls = []

    def full():
        calls.append(1)
        raise CapacityError("full")

    with pytest.raises(CapacityError):
        retry(full, RetryPolicy(attempts=5), sleep=lambda s: None)
    assert calls == [1]
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_registry_builds_providers(tmp_path):
    local = get_provider("local", state_dir=tmp_path)
    assert isinstance(local, LocalProvider) and isinstance(local, Provider)
    aws = get_provider("aws", region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="b")
    assert aws.cloud == "aws" and isinstance(aws, Provider)
    with pytest.raises(ValueError, match="unknown cloud"):
        get_provider("azure")


def test_infra_never_imports_controlplane():
    offenders = []
    for path in INFRA.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "controlplane"]
    assert offenders == []
