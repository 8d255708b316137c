"""The batch worker: a separate Celery worker on the `batches` queue in both clouds.

controlplane/tasks/app.py routes nimbus.run_batches (one Batch API run, possibly hours)
to its own queue; the entrypoint's batch-worker role consumes it (test_dockerfile checks
the -Q flags). Here: both clouds start that role next to the worker, with the worker's
identity, environment (the batch store) and secrets (the edge token), and an edge to
send the lines through.
"""

from __future__ import annotations

from tests.terraform import hcl

AWS = hcl.MODULES_ROOT / "aws"
GCP = hcl.MODULES_ROOT / "gcp"
EDGE_URL = {"NIMBUS_BATCH_EDGE_URL": "${var.batch_edge_url}"}
MERGED_ENVIRONMENT = "${merge(local.environment, each.value.environment)}"


def _resource(directory, rtype, name):
    for found_type, found_name, body in hcl.resources(directory):
        if (found_type, found_name) == (rtype, name):
            return body
    raise KeyError((rtype, name))


def _count_variables(directory):
    variables = hcl.variables(directory)
    count, edge = variables["batch_worker_count"], variables["batch_edge_url"]
    assert hcl.parse_type(count.type).kind == "number" and count.has_default
    assert hcl.blocks(directory, "variable")["batch_worker_count"]["default"] == 1
    assert hcl.parse_type(edge.type).kind == "string" and edge.required  # the platform always knows an edge


def _platform_control_plane_type(directory):
    return hcl.parse_type(hcl.variables(directory)["control_plane"].type)


# ------------------------------------------------------------------------------ AWS


def test_aws_runs_a_batch_worker_service_next_to_the_worker():
    roles = hcl.locals_(AWS / "control-plane")["roles"]
    assert set(roles) == {"api", "worker", "batch-worker", "beat"}
    batch, worker = roles["batch-worker"], roles["worker"]
    assert batch["command"] == ["batch-worker"]
    assert worker["command"] == ["worker"]
    assert batch["desired_count"] == "${var.batch_worker_count}"
    assert (batch["cpu"], batch["memory"]) == (worker["cpu"], worker["memory"])
    assert batch["load_balancer"] is None
    # Only the batch worker is told the edge; the other roles add nothing to the shared set.
    assert batch["environment"] == EDGE_URL
    assert all(role["environment"] == {} for name, role in roles.items() if name != "batch-worker")
    _count_variables(AWS / "control-plane")


def test_aws_batch_worker_shares_the_workers_task_definition_identity_env_and_secrets():
    service = hcl.blocks(AWS / "control-plane", "module")["service"]
    assert service["source"] == "../ecs-service"
    assert service["for_each"] == "${local.roles}"  # one construction for every role
    assert service["command"] == "${each.value.command}"
    assert service["desired_count"] == "${each.value.desired_count}"
    assert service["environment"] == MERGED_ENVIRONMENT
    assert service["secrets"] == "${local.secrets}"
    assert service["task_role_arn"] == "${aws_iam_role.task.arn}"
    assert service["execution_role_arn"] == "${aws_iam_role.execution.arn}"
    assert service["security_group_ids"] == ["${aws_security_group.services.id}"]
    environment = hcl.locals_(AWS / "control-plane")["environment"]
    assert 'NIMBUS_BATCH_STORE_URL = "s3://${var.batch_bucket.id}/${local.batch_prefix}"' in environment
    assert "NIMBUS_BATCH_STORE_KMS_KEY_ID = var.batch_bucket.kms_key_arn" in environment
    secrets = hcl.locals_(AWS / "control-plane")["secrets"]
    assert secrets["NIMBUS_EDGE_TOKEN"] == '${aws_secretsmanager_secret.this["edge-token"].arn}'


def test_aws_platform_points_the_batch_worker_at_the_primary_edge():
    call = hcl.blocks(AWS / "platform", "module")["control_plane"]
    assert call["batch_edge_url"] == "${module.primary.edge.url}"
    assert call["batch_worker_count"] == "${var.control_plane.batch_worker_count}"
    assert hcl.blocks(AWS / "region", "output")["edge"]["value"]["url"] == "${module.edge.url}"
    type_, optional = _platform_control_plane_type(AWS / "platform").attribute("batch_worker_count")
    assert type_.kind == "number" and optional


# ------------------------------------------------------------------------------ GCP


def test_gcp_runs_a_batch_worker_pool_next_to_the_worker():
    roles = hcl.locals_(GCP / "control-plane")["background_roles"]
    assert set(roles) == {"worker", "batch-worker", "beat"}
    assert roles["batch-worker"]["args"] == ["batch-worker"]
    assert roles["worker"]["args"] == ["worker"]
    assert roles["batch-worker"]["instances"] == "${var.batch_worker_count}"
    assert roles["batch-worker"]["environment"] == EDGE_URL
    assert all(role["environment"] == {} for name, role in roles.items() if name != "batch-worker")
    _count_variables(GCP / "control-plane")


def test_gcp_batch_worker_shares_the_workers_pool_identity_env_and_secrets():
    pool = _resource(GCP / "control-plane", "google_cloud_run_v2_worker_pool", "background")
    assert pool["for_each"] == "${local.background_roles}"
    assert pool["scaling"][0]["manual_instance_count"] == "${each.value.instances}"
    (template,) = pool["template"]
    assert template["service_account"] == "${var.service_account_email}"
    (container,) = template["containers"]
    assert container["args"] == "${each.value.args}"
    plain, secret = (block["env"] for block in container["dynamic"])
    assert plain["for_each"] == MERGED_ENVIRONMENT
    assert secret["for_each"] == "${local.secrets}"
    environment = hcl.locals_(GCP / "control-plane")["environment"]
    assert environment["NIMBUS_BATCH_STORE_URL"] == "gs://${var.artifact_bucket}/${local.batch_prefix}"
    secrets = hcl.locals_(GCP / "control-plane")["secrets"]
    assert secrets["NIMBUS_EDGE_TOKEN"] == '${local.secret_ids["edge-token"]}'


def test_gcp_platform_points_the_batch_worker_at_the_control_plane_regions_edge():
    call = hcl.blocks(GCP / "platform", "module")["control_plane"]
    assert call["batch_edge_url"] == "${module.edge[var.control_plane.region].url}"
    assert call["batch_worker_count"] == "${var.control_plane.batch_worker_count}"
    assert hcl.blocks(GCP / "edge", "output")["url"]["value"] == "https://${var.domain_name}"
    type_, optional = _platform_control_plane_type(GCP / "platform").attribute("batch_worker_count")
    assert type_.kind == "number" and optional
