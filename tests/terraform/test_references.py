"""Every reference in a module resolves: var.*, local.*, data.*, resources, module outputs.

This is the part of `terraform validate` that needs no provider schema.
"""

from __future__ import annotations

import re

import pytest

from tests.terraform import hcl

NAME = r"[A-Za-z_][A-Za-z0-9_-]*"
VAR_REF = re.compile(rf"(?<![\w.])var\.({NAME})")
LOCAL_REF = re.compile(rf"(?<![\w.])local\.({NAME})")
DATA_REF = re.compile(rf"(?<![\w.])data\.({NAME})\.({NAME})")
MODULE_REF = re.compile(rf"(?<![\w.])module\.({NAME})(?:\[[^\]]*\])?(?:\.({NAME}))?")
RESOURCE_REF = re.compile(rf"(?<![\w.\"/:-])((?:aws|google|random)_[a-z0-9_]+)\.({NAME})")
LINE_COMMENT = re.compile(r"^\s*#.*$", re.MULTILINE)


def _code(directory):
    return "\n".join(LINE_COMMENT.sub("", path.read_text()) for path in hcl.tf_files(directory))


def _declared(directory, kind):
    found = set()
    for path in hcl.tf_files(directory):
        for entry in hcl.parse_file(path).get(kind, []):
            for type_name, named in entry.items():
                for name in named:
                    found.add((type_name, name))
    return found


def _rel(path):
    return str(path.relative_to(hcl.TERRAFORM_ROOT))


@pytest.mark.parametrize("directory", hcl.all_directories(), ids=_rel)
def test_every_reference_resolves(directory):
    code = _code(directory)
    problems = []
    variables = set(hcl.variables(directory))
    problems += [f"var.{n}" for n in set(VAR_REF.findall(code)) - variables]
    problems += [f"local.{n}" for n in set(LOCAL_REF.findall(code)) - set(hcl.locals_(directory))]
    problems += [f"data.{t}.{n}" for t, n in set(DATA_REF.findall(code)) - _declared(directory, "data")]
    resources = _declared(directory, "resource")
    for rtype, name in set(RESOURCE_REF.findall(code)):
        if (rtype, name) not in resources and not name.startswith(("googleapis", "amazonaws")):
            problems.append(f"{rtype}.{name}")
    calls = {call.name: call for call in hcl.module_calls(directory)}
    for module, output in set(MODULE_REF.findall(code)):
        if module not in calls:
            problems.append(f"module.{module}")
        elif output and output not in hcl.blocks(calls[module].target, "output"):
            problems.append(f"module.{module}.{output} (no such output)")
    assert not problems, f"{_rel(directory)}: unresolved {sorted(problems)}"


def test_the_reference_check_notices_a_typo(tmp_path):
    (tmp_path / "variables.tf").write_text('variable "a" {\n  type        = string\n  description = "x"\n}\n')
    (tmp_path / "main.tf").write_text('locals {\n  b = "${var.a}-${var.c}"\n}\n')
    code = _code(tmp_path)
    assert set(VAR_REF.findall(code)) - set(hcl.variables(tmp_path)) == {"c"}
