"""Finds secret literals in files: cloud keys, private keys, tokens, passwords in code or URLs.

Generated values are fine (random_password, Secrets Manager/Secret Manager references,
${…} interpolations); a literal value for a credential is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PATTERNS: dict[str, re.Pattern[str]] = {
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "AWS secret access key": re.compile(r"(?i)aws_secret_access_key\s*[=:]\s*\S+"),
    "private key": re.compile(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),
    "GCP service account key": re.compile(r'"private_key(?:_id)?"\s*:'),
    "Google API key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "Slack token": re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    "Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "JWT": re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"),
    # A credential-named attribute or key given a literal string (not an interpolation).
    "credential literal": re.compile(
        r"""(?ix)
        (?<![A-Za-z0-9_])["']?
        (?:[a-z0-9_]*_)?(?:password|passwd|secret|token|auth_token|api_key|secret_string|secret_data|private_key)
        ["']?\s*[=:]\s*["'](?!\$\{)(?!["'])[^"'\n]{4,}["']
        """
    ),
    "credentials in a URL": re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@\"']*:(?!\$\{)[^@\s/\"']+@"),
}


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int
    kind: str
    text: str


def scan_text(path: Path, text: str) -> list[Finding]:
    findings = []
    for number, line in enumerate(text.splitlines(), start=1):
        for kind, pattern in PATTERNS.items():
            if pattern.search(line):
                findings.append(Finding(path, number, kind, line.strip()[:120]))
    return findings


def scan_tree(root: Path) -> list[Finding]:
    findings = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if ".terraform" in path.parts:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        findings.extend(scan_text(path, text))
    return findings
