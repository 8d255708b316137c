"""checkov over terraform/: zero failed checks, and every skip is inline with a reason."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.terraform import hcl

CHECKOV = hcl.REPO_ROOT / ".venv-tools" / "bin" / "checkov"
SKIP_COMMENT = re.compile(r"#\s*checkov:skip=(?P<id>[A-Z0-9_]+)(?::(?P<reason>.*))?")


@pytest.fixture(scope="module")
def checkov_report():
    if not CHECKOV.exists():
        pytest.fail(
            f"checkov is not installed at {CHECKOV}: python3 -m venv .venv-tools && "
            ".venv-tools/bin/pip install checkov (make setup does this)"
        )
    result = subprocess.run(
        [
            str(CHECKOV),
            "-d",
            str(hcl.TERRAFORM_ROOT),
            "--framework",
            "terraform",
            "--compact",
            "-o",
            "json",
            "--download-external-modules",
            "false",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=hcl.REPO_ROOT,
    )
    assert result.stdout.strip(), f"checkov printed nothing (rc={result.returncode}): {result.stderr[-2000:]}"
    report = json.loads(result.stdout)
    return report if isinstance(report, list) else [report]


@pytest.mark.slow
def test_checkov_reports_zero_failed_checks(checkov_report):
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}): {c['check_name']}"
        for report in checkov_report
        for c in report["results"]["failed_checks"]
    ]
    assert not failed, "checkov failures:\n" + "\n".join(failed)
    assert sum(r["summary"]["passed"] for r in checkov_report) > 500  # it really looked at the code
    assert all(r["summary"]["parsing_errors"] == 0 for r in checkov_report)


@pytest.mark.slow
def test_every_skip_checkov_applied_came_from_an_inline_comment_with_a_reason(checkov_report):
    for report in checkov_report:
        for check in report["results"]["skipped_checks"]:
            comment = check.get("check_result", {}).get("suppress_comment", "")
            assert comment and len(comment.split()) >= 5, f"{check['check_id']} skipped without a reason"


def test_inline_skips_all_carry_a_written_reason():
    skips = []
    for path in sorted(hcl.TERRAFORM_ROOT.rglob("*.tf")):
        for line in path.read_text().splitlines():
            match = SKIP_COMMENT.search(line)
            if match:
                skips.append((path, match))
    assert skips, "expected the documented skips"
    for path, match in skips:
        reason = (match.group("reason") or "").strip()
        assert len(reason.split()) >= 5, f"{path}: {match.group('id')} skipped without a reason"


def test_no_checkov_configuration_file_skips_checks_globally():
    for name in (".checkov.yaml", ".checkov.yml"):
        for path in hcl.REPO_ROOT.rglob(name):
            assert "skip" not in path.read_text(), f"{path} skips checks outside the code"
