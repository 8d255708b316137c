"""HashiCorp's standard module structure, checked statically on every module and environment."""

from __future__ import annotations

import re

import pytest

from tests.terraform import hcl

MODULE_FILES = ("main.tf", "variables.tf", "outputs.tf", "versions.tf", "README.md")
ENVIRONMENT_FILES = ("main.tf", "variables.tf", "outputs.tf", "versions.tf", "terraform.tfvars")
DIRECTORIES = hcl.all_directories()


def _rel(path):
    return str(path.relative_to(hcl.TERRAFORM_ROOT))


def test_the_tree_has_the_expected_modules_and_environments():
    modules = {_rel(d) for d in hcl.module_dirs()}
    for expected in (
        "modules/aws/network",
        "modules/aws/control-plane",
        "modules/aws/gpu-template",
        "modules/aws/edge",
        "modules/aws/dns",
        "modules/aws/artifact-bucket",
        "modules/gcp/network",
        "modules/gcp/control-plane",
        "modules/gcp/gpu-template",
        "modules/gcp/edge",
        "modules/gcp/global-lb",
        "modules/gcp/artifact-bucket",
        "modules/catalog",
    ):
        assert expected in modules
    assert all(d.is_dir() for d in hcl.environment_dirs())


@pytest.mark.parametrize("path", hcl.all_tf_files(), ids=_rel)
def test_every_tf_file_parses(path):
    parsed = hcl.parse_file(path)
    assert isinstance(parsed, dict)


@pytest.mark.parametrize("directory", hcl.module_dirs(), ids=_rel)
def test_module_has_standard_files(directory):
    missing = [name for name in MODULE_FILES if not (directory / name).is_file()]
    assert not missing, f"{_rel(directory)} lacks {missing}"


@pytest.mark.parametrize("directory", hcl.environment_dirs(), ids=_rel)
def test_environment_has_standard_files(directory):
    missing = [name for name in ENVIRONMENT_FILES if not (directory / name).is_file()]
    assert not missing, f"{_rel(directory)} lacks {missing}"


@pytest.mark.parametrize("directory", DIRECTORIES, ids=_rel)
def test_every_variable_has_a_type_and_a_description(directory):
    for var in hcl.variables(directory).values():
        assert var.type, f"{_rel(directory)}: variable {var.name} has no type"
        assert var.description and var.description.strip(), (
            f"{_rel(directory)}: variable {var.name} has no description"
        )
        hcl_type = var.type
        assert hcl_type.strip("${}") != "any", f"{_rel(directory)}: variable {var.name} is typed any"


@pytest.mark.parametrize("directory", DIRECTORIES, ids=_rel)
def test_every_output_has_a_description(directory):
    for name, body in hcl.blocks(directory, "output").items():
        assert body.get("description"), f"{_rel(directory)}: output {name} has no description"


@pytest.mark.parametrize("directory", DIRECTORIES, ids=_rel)
def test_variables_and_outputs_live_in_their_files(directory):
    for path in hcl.tf_files(directory):
        parsed = hcl.parse_file(path)
        if path.name != "variables.tf":
            assert "variable" not in parsed, f"{_rel(path)} declares variables outside variables.tf"
        if path.name != "outputs.tf":
            assert "output" not in parsed, f"{_rel(path)} declares outputs outside outputs.tf"


def _required_providers(directory):
    found = {}
    for entry in hcl.parse_file(directory / "versions.tf").get("terraform", []):
        for block in entry.get("required_providers", []):
            found.update(block)
    return found


def _providers_used(directory):
    used = set()
    for path in hcl.tf_files(directory):
        parsed = hcl.parse_file(path)
        for kind in ("resource", "data"):
            for entry in parsed.get(kind, []):
                for type_name in entry:
                    used.add(type_name.split("_", 1)[0])
        for entry in parsed.get("resource", []) + parsed.get("data", []):
            for named in entry.values():
                for body in named.values():
                    provider = str(body.get("provider", ""))
                    if provider:
                        used.add(provider.strip("${}").split(".")[0])
    return used


@pytest.mark.parametrize("directory", DIRECTORIES, ids=_rel)
def test_versions_pin_terraform_and_every_provider_used(directory):
    parsed = hcl.parse_file(directory / "versions.tf")
    terraform = parsed["terraform"][0]
    assert terraform.get("required_version"), f"{_rel(directory)}: no required_version"
    declared = _required_providers(directory)
    for name, spec in declared.items():
        assert re.fullmatch(r"(~> |= )?\d+\.\d+(\.\d+)?", spec["version"]), (
            f"{name}: unpinned {spec['version']!r}"
        )
        assert spec["source"] == f"hashicorp/{name}"
    missing = {p for p in _providers_used(directory) if p not in {"terraform"}} - set(declared)
    assert not missing, f"{_rel(directory)} uses providers it does not require: {missing}"


def test_every_module_uses_the_same_pins():
    pins: dict[str, set[str]] = {}
    for directory in DIRECTORIES:
        for name, spec in _required_providers(directory).items():
            pins.setdefault(name, set()).add(spec["version"])
    assert all(len(v) == 1 for v in pins.values()), pins


CALLS = [call for directory in DIRECTORIES for call in hcl.module_calls(directory)]


def _call_id(call):
    return f"{_rel(call.caller)}:{call.name}"


@pytest.mark.parametrize("call", CALLS, ids=_call_id)
def test_module_call_names_an_existing_module(call):
    assert call.source.startswith("../"), f"{_call_id(call)}: only local modules are used"
    assert call.target.is_dir() and hcl.tf_files(call.target), f"{_call_id(call)}: no module at {call.source}"


@pytest.mark.parametrize("call", CALLS, ids=_call_id)
def test_module_call_passes_only_declared_inputs(call):
    declared = set(hcl.variables(call.target))
    unknown = call.arguments - declared
    assert not unknown, f"{_call_id(call)} passes undeclared inputs {sorted(unknown)}"


@pytest.mark.parametrize("call", CALLS, ids=_call_id)
def test_module_call_passes_every_required_input(call):
    required = {v.name for v in hcl.variables(call.target).values() if v.required}
    missing = required - call.arguments
    assert not missing, f"{_call_id(call)} misses required inputs {sorted(missing)}"


def _configuration_aliases(directory):
    aliases = set()
    for spec in _required_providers(directory).values():
        for alias in spec.get("configuration_aliases", []):
            aliases.add(str(alias).strip("${}"))
    return aliases


@pytest.mark.parametrize("call", CALLS, ids=_call_id)
def test_module_call_hands_over_the_provider_aliases_it_needs(call):
    needed = _configuration_aliases(call.target)
    body = hcl.blocks(call.caller, "module")[call.name]
    given = {str(key).strip("${}") for key in body.get("providers", {})}
    assert needed <= given, f"{_call_id(call)} must pass providers {sorted(needed - given)}"


@pytest.mark.parametrize("directory", hcl.environment_dirs(), ids=_rel)
def test_example_tfvars_set_only_declared_and_all_required_variables(directory):
    values = hcl.parse_file(directory / "terraform.tfvars")
    declared = hcl.variables(directory)
    assert set(values) <= set(declared), f"unknown variables {set(values) - set(declared)}"
    missing = {name for name, var in declared.items() if var.required} - set(values)
    assert not missing, f"{_rel(directory)}/terraform.tfvars misses {missing}"


@pytest.mark.parametrize("directory", hcl.environment_dirs(), ids=_rel)
def test_environment_outputs_the_cloud_catalog(directory):
    outputs = hcl.blocks(directory, "output")
    assert outputs["cloud_catalog"]["value"] == "${module.catalog.json}"
    assert hcl.blocks(directory, "module")["catalog"]["source"] == "../../modules/catalog"


def test_the_structure_checks_catch_a_bad_call(tmp_path):
    """The call checks really fail: an undeclared input and a missing required one."""
    module = tmp_path / "modules" / "m"
    module.mkdir(parents=True)
    (module / "variables.tf").write_text(
        'variable "needed" {\n  type        = string\n  description = "x"\n}\n'
    )
    caller = tmp_path / "env"
    caller.mkdir()
    (caller / "main.tf").write_text('module "m" {\n  source = "../modules/m"\n  typo = 1\n}\n')
    (call,) = hcl.module_calls(caller)
    assert call.arguments - set(hcl.variables(call.target)) == {"typo"}
    assert {v.name for v in hcl.variables(call.target).values() if v.required} - call.arguments == {"needed"}


@pytest.mark.parametrize("directory", hcl.module_dirs(), ids=_rel)
def test_module_readme_tables_match_the_code(directory):
    from tests.terraform import readme

    text = (directory / "README.md").read_text()
    assert readme.MARKER in text, f"{_rel(directory)}/README.md has no generated tables"
    head = text.split(readme.MARKER, 1)[0]
    assert head.startswith("# ") and len(head.split()) > 20, (
        f"{_rel(directory)}/README.md needs a description"
    )
    assert text == readme.expected_readme(directory), (
        f"{_rel(directory)}/README.md is stale: run python -m tests.terraform.readme"
    )
