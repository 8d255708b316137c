"""The cloud catalog an environment emits, evaluated in Python from its example tfvars.

Terraform cannot run here (no providers), so this mirrors the environments' catalog
wiring (environments/*/main.tf -> modules/*/platform -> modules/catalog) with the ids
only a real apply knows replaced by fixed placeholders. The result is committed as
``terraform/environments/<env>/catalog.sample.json``; tests check the sample is current
and valid, and the control plane's import tests read it.

Regenerate with ``python -m tests.terraform.catalog_sample``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from tests.terraform import hcl

PLACEHOLDER_ACCOUNT = "000000000000"
# name_prefix adds a 26-character suffix to GCP instance template names.
PLACEHOLDER_TEMPLATE_SUFFIX = "0" * 26
COMPUTE_API = "https://www.googleapis.com/compute/v1"


def placeholder_launch_template_id(index: int) -> str:
    return f"lt-{index:017x}"


def placeholder_subnet_id(region_index: int, zone_index: int) -> str:
    return f"subnet-{region_index * 256 + zone_index:017x}"


def environment_inputs(env: str) -> dict[str, Any]:
    """The environment's variables as Terraform would see them: tfvars over defaults."""
    directory = hcl.ENVIRONMENTS_ROOT / env
    values = dict(hcl.parse_file(directory / "terraform.tfvars"))
    for name, body in hcl.blocks(directory, "variable").items():
        if name not in values and "default" in body:
            values[name] = body["default"]
    return values


def catalog_instance_type(it: dict[str, Any]) -> dict[str, Any]:
    """modules/catalog: unset optional keys are dropped, spot_price is always present."""
    entry = {key: value for key, value in it.items() if value is not None}
    entry["spot_price"] = it.get("spot_price")
    return entry


def aws_region(name: str, domain: str, index: int, region: dict[str, Any]) -> dict[str, Any]:
    """modules/aws/region output catalog_region, plus the environment's instance types."""
    rname = region["region"]
    return {
        "name": rname,
        "edge_url": f"https://{rname}.api.{domain}",
        "artifact_bucket": f"s3://{name}-artifacts-{rname}-{PLACEHOLDER_ACCOUNT}",
        "template": {
            "kind": "aws_launch_template",
            "id": placeholder_launch_template_id(index),
            "name": f"{name}-gpu-{rname}",
            "version": "1",
        },
        "zones": [
            {"name": zone, "subnet": placeholder_subnet_id(index, z)}
            for z, zone in enumerate(region["zones"])
        ],
        "instance_types": [catalog_instance_type(it) for it in region["instance_types"]],
    }


def gcp_region(name: str, project: str, domain: str, rname: str, region: dict[str, Any]) -> dict[str, Any]:
    """modules/gcp/platform output catalog_regions, plus the environment's zones and types."""
    template_name = f"{name}-gpu-{rname}-{PLACEHOLDER_TEMPLATE_SUFFIX}"
    subnet = f"{COMPUTE_API}/projects/{project}/regions/{rname}/subnetworks/{name}-nodes-{rname}"
    return {
        "name": rname,
        "edge_url": f"https://{rname}.api.{domain}",
        "artifact_bucket": f"gs://{project}-{name}-artifacts-{rname}",
        "template": {
            "kind": "gcp_instance_template",
            "id": f"{COMPUTE_API}/projects/{project}/regions/{rname}/instanceTemplates/{template_name}",
            "name": template_name,
        },
        "zones": [{"name": zone, "subnet": subnet} for zone in region["zones"]],
        "instance_types": [catalog_instance_type(it) for it in region["instance_types"]],
    }


def aws_cloud(name: str, domain: str, primary: dict[str, Any], secondary: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "aws",
        "project": PLACEHOLDER_ACCOUNT,
        "regions": [aws_region(name, domain, i, r) for i, r in enumerate((primary, secondary))],
    }


def gcp_cloud(name: str, project: str, domain: str, regions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    # Terraform iterates a map in lexicographic key order.
    return {
        "name": "gcp",
        "project": project,
        "regions": [gcp_region(name, project, domain, r, regions[r]) for r in sorted(regions)],
    }


def sample_catalog(env: str) -> dict[str, Any]:
    v = environment_inputs(env)
    if env == "aws":
        clouds = [aws_cloud(v["name"], v["domain"], v["primary"], v["secondary"])]
    elif env == "gcp":
        clouds = [gcp_cloud(v["name"], v["project_id"], v["domain"], v["regions"])]
    elif env == "multicloud":
        clouds = [
            aws_cloud(v["name"], v["domain"], v["aws_primary"], v["aws_secondary"]),
            gcp_cloud(v["name"], v["gcp_project_id"], v["domain"], v["gcp_regions"]),
        ]
    else:
        raise ValueError(env)
    return {"version": 1, "generated_by": f"terraform/environments/{env}", "clouds": clouds}


def render(catalog: dict[str, Any]) -> str:
    # jsonencode writes object keys in lexicographic order.
    return json.dumps(catalog, indent=2, sort_keys=True) + "\n"


def sample_path(env: str):
    return hcl.ENVIRONMENTS_ROOT / env / "catalog.sample.json"


def main() -> int:
    for env in hcl.ENVIRONMENTS:
        sample_path(env).write_text(render(sample_catalog(env)))
        print(sample_path(env).relative_to(hcl.REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
