"""Least privilege: the control plane gets only the cloud calls the providers make, scoped to Nimbus nodes."""

from __future__ import annotations

from tests.terraform import hcl

AWS = hcl.MODULES_ROOT / "aws"
GCP = hcl.MODULES_ROOT / "gcp"


def _policy_document(directory, name):
    for path in hcl.tf_files(directory):
        for entry in hcl.parse_file(path).get("data", []):
            doc = entry.get("aws_iam_policy_document", {}).get(name)
            if doc is not None:
                return doc["statement"]
    raise KeyError(name)


def _conditions(statement):
    return {(c["test"], c["variable"]): c["values"] for c in statement.get("condition", [])}


def _resource(directory, rtype, name):
    for found_type, found_name, body in hcl.resources(directory):
        if (found_type, found_name) == (rtype, name):
            return body
    raise KeyError((rtype, name))


# What infra/aws.py calls (the list), plus the KMS grant EC2 needs to create
# volumes encrypted with a customer key on the caller's behalf.
AWS_PROVIDER_ACTIONS = {
    "ec2:RunInstances",
    "ec2:CreateTags",
    "ec2:DescribeInstances",
    "ec2:TerminateInstances",
    "ec2:DescribeLaunchTemplates",
    "ec2:DescribeLaunchTemplateVersions",
    "iam:PassRole",
}
KMS_FOR_ENCRYPTED_VOLUMES = {
    "kms:CreateGrant",
    "kms:Decrypt",
    "kms:DescribeKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncrypt*",
}


def test_aws_control_plane_holds_only_the_provider_actions():
    statements = _policy_document(AWS / "control-plane", "provision")
    actions = {action for s in statements for action in s["actions"]}
    assert actions == AWS_PROVIDER_ACTIONS | KMS_FOR_ENCRYPTED_VOLUMES


def test_aws_only_describe_calls_use_a_wildcard_resource():
    for s in _policy_document(AWS / "control-plane", "provision"):
        if "*" in s["resources"]:
            assert all(a.startswith("ec2:Describe") for a in s["actions"]), s["sid"]


def test_aws_new_instances_and_volumes_must_carry_the_ownership_tags_and_come_from_a_template():
    (statement,) = [
        s for s in _policy_document(AWS / "control-plane", "provision") if s["sid"] == "LaunchTaggedNodes"
    ]
    assert any(r.endswith(":instance/*") for r in statement["resources"])
    assert any(r.endswith(":volume/*") for r in statement["resources"])
    conditions = _conditions(statement)
    assert conditions[("StringEquals", "aws:RequestTag/managed-by")] == ["nimbus"]
    assert conditions[("StringEquals", "aws:RequestTag/nimbus-cluster")] == ["${var.cluster_name}"]
    assert conditions[("Null", "aws:RequestTag/nimbus-node-id")] == ["false"]
    # infra/provider.py tags nimbus-pool-id only when the node belongs to a pool.
    assert ("Null", "aws:RequestTag/nimbus-pool-id") not in conditions
    assert conditions[("ArnLike", "ec2:LaunchTemplate")] == "${var.gpu_launch_template_arns}"


def test_aws_tags_only_at_launch_and_terminates_only_own_nodes():
    statements = {s["sid"]: s for s in _policy_document(AWS / "control-plane", "provision")}
    assert _conditions(statements["TagOnLaunch"])[("StringEquals", "ec2:CreateAction")] == ["RunInstances"]
    terminate = _conditions(statements["TerminateOwnNodes"])
    assert terminate[("StringEquals", "aws:ResourceTag/managed-by")] == ["nimbus"]
    assert terminate[("StringEquals", "aws:ResourceTag/nimbus-cluster")] == ["${var.cluster_name}"]


def test_aws_passes_only_the_gpu_node_role_to_ec2():
    statements = [
        s for s in _policy_document(AWS / "control-plane", "provision") if "iam:PassRole" in s["actions"]
    ]
    (statement,) = statements
    assert statement["resources"] == "${var.gpu_instance_role_arns}"
    assert _conditions(statement)[("StringEquals", "iam:PassedToService")] == ["ec2.amazonaws.com"]


def test_aws_gpu_node_role_only_reads_weights():
    statements = _policy_document(AWS / "gpu-template", "node")
    actions = {a for s in statements for a in s["actions"]}
    assert actions == {"s3:ListBucket", "s3:GetObject", "kms:Decrypt"}
    assert all("artifact_bucket_arn" in str(s["resources"]) or s["sid"] == "UseBucketKey" for s in statements)


def test_aws_launch_template_enforces_imdsv2_and_encryption():
    template = _resource(AWS / "gpu-template", "aws_launch_template", "this")
    metadata = template["metadata_options"][0]
    assert metadata["http_tokens"] == "required"
    assert metadata["http_put_response_hop_limit"] == 1
    ebs = template["block_device_mappings"][0]["ebs"][0]
    assert ebs["encrypted"] is True and ebs["kms_key_id"] == "${var.kms_key_arn}"
    assert "network_interfaces" not in template  # no public address option at all


def test_aws_gpu_nodes_admit_only_the_edge_and_the_control_plane():
    gpu = AWS / "gpu-template"
    ingress = [
        (name, body)
        for rtype, name, body in hcl.resources(gpu)
        if rtype == "aws_vpc_security_group_ingress_rule"
    ]
    assert {name for name, _ in ingress} == {"from_security_groups", "from_cidrs"}
    region = hcl.blocks(AWS / "region", "module")["gpu_template"]
    assert region["admitted_security_groups"] == (
        "${merge(var.admitted_security_groups, {edge = module.edge.security_group_id})}"
    )
    platform = hcl.blocks(AWS / "platform", "module")["primary"]
    assert platform["admitted_security_groups"] == {
        "control_plane": "${module.control_plane.services_security_group_id}"
    }


# What infra/gcp.py calls: instanceTemplates.get (regional or global), instances.insert
# with the template's properties (labels, metadata, service account, tags, scheduling
# for spot), instances.get/aggregatedList/delete, zoneOperations.wait.
GCP_PROVIDER_PERMISSIONS = {
    "compute.instances.create",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.delete",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
    "compute.instances.setTags",
    "compute.instances.setScheduling",
    "compute.disks.create",
    "compute.disks.setLabels",
    "compute.images.useReadOnly",
    "compute.instanceTemplates.get",
    "compute.instanceTemplates.useReadOnly",
    "compute.subnetworks.use",
    "compute.zoneOperations.get",
}


def test_gcp_provisioner_role_has_exactly_the_provider_permissions():
    role = _resource(GCP / "provisioner", "google_project_iam_custom_role", "this")
    assert set(role["permissions"]) == GCP_PROVIDER_PERMISSIONS


def test_gcp_provisioner_touches_only_nimbus_named_instances_and_acts_only_as_gpu_accounts():
    member = _resource(GCP / "provisioner", "google_project_iam_member", "this")
    expression = member["condition"][0]["expression"].replace('\\"', '"')
    assert 'resource.name.extract("/instances/{name}").startsWith("${var.node_name_prefix}")' in expression
    assert 'resource.name.extract("/disks/{name}").startsWith("${var.node_name_prefix}")' in expression
    act_as = _resource(GCP / "provisioner", "google_service_account_iam_member", "act_as_gpu")
    assert act_as["for_each"] == "${var.gpu_service_account_ids}"
    assert act_as["role"] == "roles/iam.serviceAccountUser"
    project_roles = [
        body["role"]
        for rtype, _, body in hcl.resources(GCP / "provisioner")
        if rtype == "google_project_iam_member"
    ]
    assert project_roles == ["${google_project_iam_custom_role.this.id}"]


def test_gcp_instance_templates_label_nodes_and_keep_them_private():
    template = _resource(GCP / "gpu-template", "google_compute_region_instance_template", "this")
    assert "access_config" not in template["network_interface"][0]
    assert template["disk"][0]["disk_encryption_key"][0]["kms_key_self_link"] == "${var.kms_key_id}"
    ownership = hcl.locals_(GCP / "gpu-template")["ownership_labels"]
    assert ownership == {"managed-by": "nimbus", "nimbus-cluster": "${var.cluster_name}"}
    aws_tags = hcl.locals_(AWS / "gpu-template")["ownership_tags"]
    assert aws_tags == {"managed-by": "nimbus", "nimbus-cluster": "${var.cluster_name}"}


def test_gcp_gpu_node_account_only_reads_weights():
    member = _resource(GCP / "gpu-template", "google_storage_bucket_iam_member", "node")
    assert member["role"] == "roles/storage.objectViewer"
    project_roles = _resource(GCP / "gpu-template", "google_project_iam_member", "node")["for_each"]
    assert project_roles == '${toset(["roles/logging.logWriter", "roles/monitoring.metricWriter"])}'


# The Batch API's files (infra/objectstore.py) under batches/ of the control plane's
# regional artifact bucket: read, write and delete there, nothing else in the bucket.
BATCH_FILE_ACTIONS = {"s3:PutObject", "s3:GetObject", "s3:DeleteObject"}


def test_aws_control_plane_reaches_batch_files_only_under_the_batches_prefix():
    statements = {s["sid"]: s for s in _policy_document(AWS / "control-plane", "batch_files")}
    assert hcl.locals_(AWS / "control-plane")["batch_prefix"] == "batches"
    objects = statements["ReadWriteBatchFiles"]
    assert set(objects["actions"]) == BATCH_FILE_ACTIONS
    assert objects["resources"] == ["${var.batch_bucket.arn}/${local.batch_prefix}/*"]
    # ListBucket only so a missing key reads as 404, not 403; on the bucket, never on objects.
    assert statements["TellMissingBatchFilesApart"]["actions"] == ["s3:ListBucket"]
    assert statements["TellMissingBatchFilesApart"]["resources"] == ["${var.batch_bucket.arn}"]
    kms = statements["EncryptBatchFiles"]
    assert set(kms["actions"]) == {"kms:GenerateDataKey", "kms:Decrypt"}
    assert kms["resources"] == ["${var.batch_bucket.kms_key_arn}"]
    conditions = _conditions(kms)
    assert conditions[("StringEquals", "kms:ViaService")] == ["s3.${data.aws_region.current.name}.amazonaws.com"]
    assert conditions[("ArnLike", "kms:EncryptionContext:aws:s3:arn")] == [
        "${var.batch_bucket.arn}",
        "${var.batch_bucket.arn}/${local.batch_prefix}/*",
    ]
    assert set(statements) == {"ReadWriteBatchFiles", "TellMissingBatchFilesApart", "EncryptBatchFiles"}


def test_aws_batch_file_grant_is_on_the_task_role_the_api_and_workers_run_as():
    policies = {
        name: body for rtype, name, body in hcl.resources(AWS / "control-plane") if rtype == "aws_iam_role_policy"
    }
    assert policies["batch_files"]["role"] == "${aws_iam_role.task.id}"
    assert policies["batch_files"]["policy"] == "${data.aws_iam_policy_document.batch_files.json}"
    # The task role holds the provisioning policy and this one, nothing more.
    assert {n for n, b in policies.items() if b["role"] == "${aws_iam_role.task.id}"} == {"provision", "batch_files"}
    service = hcl.blocks(AWS / "control-plane", "module")["service"]
    assert service["task_role_arn"] == "${aws_iam_role.task.arn}"
    roles = hcl.locals_(AWS / "control-plane")["roles"]
    assert {"api", "worker", "batch-worker"} <= set(roles)


def test_aws_control_plane_is_told_where_batch_files_live():
    environment = hcl.locals_(AWS / "control-plane")["environment"]
    # environment is merge(var.environment, {...}); python-hcl2 keeps it as one expression.
    assert 'NIMBUS_BATCH_STORE_URL = "s3://${var.batch_bucket.id}/${local.batch_prefix}"' in environment
    assert "NIMBUS_BATCH_STORE_KMS_KEY_ID = var.batch_bucket.kms_key_arn" in environment
    service = hcl.blocks(AWS / "control-plane", "module")["service"]
    # Every role gets the shared environment; a role's own variables only add to it.
    assert service["environment"] == "${merge(local.environment, each.value.environment)}"
    platform = hcl.blocks(AWS / "platform", "module")["control_plane"]
    assert platform["batch_bucket"] == (
        "${merge(module.primary.artifact_bucket, {kms_key_arn = module.kms_primary.key_arn})}"
    )
    region_output = hcl.blocks(AWS / "region", "output")["artifact_bucket"]["value"]
    assert region_output == {"id": "${module.artifacts.bucket_id}", "arn": "${module.artifacts.bucket_arn}"}


def test_gcp_control_plane_reaches_batch_files_only_under_the_batches_prefix():
    member = _resource(GCP / "control-plane", "google_storage_bucket_iam_member", "batch_files")
    assert member["bucket"] == "${var.artifact_bucket}"
    assert member["role"] == "roles/storage.objectUser"
    assert member["member"] == "${local.member}"
    assert hcl.locals_(GCP / "control-plane")["member"] == "serviceAccount:${var.service_account_email}"
    (condition,) = member["condition"]
    expression = condition["expression"].replace('\\"', '"')
    assert expression == (
        'resource.name.startsWith("projects/_/buckets/${var.artifact_bucket}/objects/${local.batch_prefix}/")'
    )
    assert hcl.locals_(GCP / "control-plane")["batch_prefix"] == "batches"
    # No other storage grant for the control plane.
    storage = [n for t, n, _ in hcl.resources(GCP / "control-plane") if t.startswith("google_storage_")]
    assert storage == ["batch_files"]


def test_gcp_control_plane_is_told_where_batch_files_live():
    environment = hcl.locals_(GCP / "control-plane")["environment"]
    assert environment["NIMBUS_BATCH_STORE_URL"] == "gs://${var.artifact_bucket}/${local.batch_prefix}"
    api = hcl.blocks(GCP / "control-plane", "module")["api"]
    assert api["environment"] == "${local.environment}"
    workers = _resource(GCP / "control-plane", "google_cloud_run_v2_worker_pool", "background")
    env_blocks = workers["template"][0]["containers"][0]["dynamic"]
    assert env_blocks[0]["env"]["for_each"] == "${merge(local.environment, each.value.environment)}"
    platform = hcl.blocks(GCP / "platform", "module")["control_plane"]
    assert platform["artifact_bucket"] == "${module.artifacts[var.control_plane.region].name}"
