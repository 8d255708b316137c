"""Inputs and outputs tables of every module README, generated from the HCL.

Each README keeps a hand-written description above the marker line; everything below
it is generated, so the tables never drift from variables.tf and outputs.tf.
Regenerate with ``python -m tests.terraform.readme``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.terraform import hcl

MARKER = "<!-- generated from variables.tf and outputs.tf: python -m tests.terraform.readme -->"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type(text: str | None) -> str:
    text = (text or "").removeprefix("${").removesuffix("}")
    return f"`{_cell(text)}`" if len(text) <= 60 else "object (see variables.tf)"


def tables(directory: Path) -> str:
    lines = [MARKER, "", "## Inputs", "", "| name | type | required | description |", "|---|---|---|---|"]
    for var in sorted(hcl.variables(directory).values(), key=lambda v: (not v.required, v.name)):
        lines.append(
            f"| `{var.name}` | {_type(var.type)} | {'yes' if var.required else 'no'} | "
            f"{_cell(var.description or '')} |"
        )
    lines += ["", "## Outputs", "", "| name | description |", "|---|---|"]
    for name, body in sorted(hcl.blocks(directory, "output").items()):
        lines.append(f"| `{name}` | {_cell(body.get('description', ''))} |")
    return "\n".join(lines) + "\n"


def expected_readme(directory: Path) -> str:
    current = (directory / "README.md").read_text()
    head = current.split(MARKER, 1)[0].rstrip() + "\n\n"
    return head + tables(directory)


def main() -> int:
    for directory in hcl.module_dirs():
        readme = directory / "README.md"
        readme.write_text(expected_readme(directory))
        print(readme.relative_to(hcl.REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
