"""No secret literal anywhere in terraform/: credentials are generated and live in secret stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.terraform import hcl, secret_scan


def test_no_secret_literal_anywhere_in_terraform():
    findings = secret_scan.scan_tree(hcl.TERRAFORM_ROOT)
    assert not findings, "\n".join(f"{f.path}:{f.line}: {f.kind}: {f.text}" for f in findings)


PLANTED = [
    ("AWS access key id", 'access_key = "AKIAIOSFODNN7EXAMPLE"'),
    ("private key", "-----BEGIN RSA PRIVATE KEY-----"),
    ("credential literal", 'password = "hunter2hunter2"'),
    ("credential literal", 'auth_token                 = "0123456789abcdef"'),
    ("credential literal", '  NIMBUS_ADMIN_TOKEN = "letmein-please"'),
    ("credential literal", '"secret_string": "plain-text-value"'),
    ("credentials in a URL", 'url = "postgresql://nimbus:s3cr3t@db.internal:5432/nimbus"'),
    ("GitHub token", "ghp_" + "a" * 36),
    ("Hugging Face token", "hf_" + "b" * 34),
]


@pytest.mark.parametrize(("kind", "line"), PLANTED)
def test_the_scanner_catches_planted_secrets(kind, line):
    kinds = {f.kind for f in secret_scan.scan_text(Path("planted.tf"), line)}
    assert kind in kinds


@pytest.mark.parametrize(
    "line",
    [
        '  password = random_password.this["database"].result',
        "  secret_string = local.secret_values[each.key]",
        '    redis-url      = "${local.redis_base}/0"',
        '  redis_base = "rediss://:${local.redis_auth}@${aws_elasticache_replication_group.this.primary_endpoint_address}"',
        '    NIMBUS_EDGE_TOKEN     = aws_secretsmanager_secret.this["edge-token"].arn',
        '  description = "Bearer token edges use for the internal snapshot API."',
    ],
)
def test_the_scanner_lets_generated_and_referenced_values_pass(line):
    assert secret_scan.scan_text(Path("ok.tf"), line) == []


def test_secrets_are_generated_not_supplied():
    """Every secret store entry is fed from random_password or a generated service value."""
    fed = []
    for directory in hcl.module_dirs():
        for rtype, _name, body in hcl.resources(directory):
            if rtype == "aws_secretsmanager_secret_version":
                fed.append(body["secret_string"])
            if rtype == "google_secret_manager_secret_version":
                fed.append(body["secret_data"])
    assert fed
    assert all(value.startswith("${") for value in fed), fed
    no_password_variables = [
        (directory, name)
        for directory in hcl.all_directories()
        for name in hcl.variables(directory)
        if any(word in name for word in ("password", "token", "secret_key"))
    ]
    assert not no_password_variables, f"credentials must not be inputs: {no_password_variables}"
