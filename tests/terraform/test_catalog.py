"""The cloud catalog output against the one schema both sides use (infra/catalog/schema.json)."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from infra.catalog import SCHEMA_PATH, load_catalog
from tests.terraform import catalog_sample, hcl

SCHEMA = json.loads(SCHEMA_PATH.read_text())
CATALOG_MODULE = hcl.MODULES_ROOT / "catalog"
ENVIRONMENTS = hcl.ENVIRONMENTS


def _schema_def(name):
    return SCHEMA["$defs"][name]


def _assert_object_matches(tf_type, schema_def, where):
    assert tf_type.kind == "object", where
    assert tf_type.attribute_names == set(schema_def["properties"]), f"{where}: keys differ from the schema"
    assert tf_type.required_names == set(schema_def.get("required", [])), f"{where}: required keys differ"


def _element(tf_type):
    assert tf_type.kind == "list", tf_type
    return tf_type.element


def _catalog_clouds_type():
    return hcl.parse_type(hcl.variables(CATALOG_MODULE)["clouds"].type)


def test_catalog_module_types_mirror_the_schema():
    cloud = _element(_catalog_clouds_type())
    _assert_object_matches(cloud, _schema_def("cloud"), "cloud")
    region = _element(cloud.attribute("regions")[0])
    _assert_object_matches(region, _schema_def("region"), "region")
    _assert_object_matches(region.attribute("template")[0], _schema_def("template"), "template")
    _assert_object_matches(_element(region.attribute("zones")[0]), _schema_def("zone"), "zone")
    _assert_object_matches(
        _element(region.attribute("instance_types")[0]), _schema_def("instance_type"), "instance_type"
    )


def test_catalog_document_keys_match_the_schema_root():
    catalog_local = hcl.locals_(CATALOG_MODULE)["catalog"]
    assert set(catalog_local) == set(SCHEMA["properties"])
    assert catalog_local["version"] == SCHEMA["properties"]["version"]["const"]


def _instance_type_types(env):
    """Every instance_types attribute in the environment's variable types."""
    found = []

    def walk(tf_type):
        for name, attr_type, _ in tf_type.attributes:
            if name == "instance_types":
                found.append(_element(attr_type))
            walk(attr_type)
        if tf_type.element is not None:
            walk(tf_type.element)

    for var in hcl.variables(hcl.ENVIRONMENTS_ROOT / env).values():
        walk(hcl.parse_type(var.type))
    return found


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_environment_instance_type_inputs_mirror_the_schema(env):
    types = _instance_type_types(env)
    assert types, f"{env} declares no instance_types input"
    for tf_type in types:
        _assert_object_matches(tf_type, _schema_def("instance_type"), f"{env} instance_types")


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_sample_catalog_from_the_example_tfvars_is_valid(env):
    catalog = catalog_sample.sample_catalog(env)
    jsonschema.Draft202012Validator(SCHEMA).validate(catalog)
    loaded = load_catalog(catalog)  # the loader infra/ and the control plane use
    assert loaded.generated_by == f"terraform/environments/{env}"
    assert sum(len(cloud.regions) for cloud in loaded.clouds) >= 2


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_committed_sample_is_what_the_tfvars_produce(env):
    committed = catalog_sample.sample_path(env).read_text()
    assert committed == catalog_sample.render(catalog_sample.sample_catalog(env)), (
        f"{catalog_sample.sample_path(env)} is stale: run python -m tests.terraform.catalog_sample"
    )


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_sample_is_consistent_within_each_region(env):
    for cloud in catalog_sample.sample_catalog(env)["clouds"]:
        for region in cloud["regions"]:
            zones = {zone["name"] for zone in region["zones"]}
            assert all(zone.startswith(region["name"]) for zone in zones), region["name"]
            for it in region["instance_types"]:
                assert set(it.get("zones", zones)) <= zones, f"{it['name']} offered outside {region['name']}"
            names = [it["name"] for it in region["instance_types"]]
            assert len(names) == len(set(names)), f"duplicate instance types in {region['name']}"


def test_multicloud_covers_both_clouds_with_edges_in_several_regions():
    catalog = catalog_sample.sample_catalog("multicloud")
    assert [cloud["name"] for cloud in catalog["clouds"]] == ["aws", "gcp"]
    edges = [region["edge_url"] for cloud in catalog["clouds"] for region in cloud["regions"]]
    assert len(edges) >= 4 and len(set(edges)) == len(edges)


def test_schema_rejects_a_broken_catalog():
    """The validation above can fail: a region without template or a null zone list is refused."""
    catalog = catalog_sample.sample_catalog("aws")
    broken = copy.deepcopy(catalog)
    del broken["clouds"][0]["regions"][0]["template"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(broken)
    nulled = copy.deepcopy(catalog)
    nulled["clouds"][0]["regions"][0]["instance_types"][0]["zones"] = None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(nulled)


# The sample's names and ids follow the formats the modules build; if a module changes
# one, the sample (and the placeholders the control plane tests rely on) must follow.
NAME_FORMATS = [
    (
        "aws/artifact-bucket",
        "bucket_name",
        "${var.name}-artifacts-${data.aws_region.current.name}-${data.aws_caller_identity.current.account_id}",
    ),
    ("aws/gpu-template", "full_name", "${var.name}-gpu-${local.region}"),
    ("gcp/artifact-bucket", "bucket_name", "${var.project_id}-${var.name}-artifacts-${var.region}"),
]


@pytest.mark.parametrize(("module", "local", "expected"), NAME_FORMATS)
def test_sample_names_follow_the_module_formats(module, local, expected):
    assert hcl.locals_(hcl.MODULES_ROOT / module)[local] == expected


def test_sample_urls_follow_the_module_formats():
    aws_region = hcl.blocks(hcl.MODULES_ROOT / "aws/region", "module")["edge"]
    assert aws_region["domain_name"] == "${local.region}.${var.global_domain_name}"
    assert hcl.locals_(hcl.MODULES_ROOT / "aws/platform")["api_domain_name"] == "api.${var.domain}"
    gcp_platform = hcl.MODULES_ROOT / "gcp/platform"
    assert hcl.blocks(gcp_platform, "module")["edge"]["domain_name"] == "${each.key}.${local.api_domain_name}"
    assert hcl.locals_(gcp_platform)["api_domain_name"] == "api.${var.domain}"
    (template,) = [
        body
        for rtype, _, body in hcl.resources(hcl.MODULES_ROOT / "gcp/gpu-template")
        if rtype == "google_compute_region_instance_template"
    ]
    assert template["name_prefix"] == "${var.name}-gpu-${var.region}-"
    subnets = {
        name: body
        for rtype, name, body in hcl.resources(hcl.MODULES_ROOT / "gcp/network")
        if rtype == "google_compute_subnetwork"
    }
    assert subnets["nodes"]["name"] == "${var.name}-nodes-${each.key}"
