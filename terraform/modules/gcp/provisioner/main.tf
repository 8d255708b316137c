resource "google_service_account" "this" {
  project      = var.project_id
  account_id   = "${var.name}-control-plane"
  display_name = "Nimbus control plane (GPU node provisioner)"
}

# Exactly the Compute Engine permissions the GCP provider in infra/gcp needs:
# instanceTemplates.get (it reads the template it launches from), instances.insert
# from a regional instance template (with labels, metadata and the GPU service
# account), instances.get/list (aggregatedList)/delete and zoneOperations.get/wait.
resource "google_project_iam_custom_role" "this" {
  project     = var.project_id
  role_id     = replace("${var.name}_provisioner", "-", "_")
  title       = "Nimbus GPU node provisioner"
  description = "Launch GPU nodes from Nimbus instance templates, watch and delete them"
  permissions = [
    "compute.disks.create",
    "compute.disks.setLabels",
    "compute.images.useReadOnly",
    "compute.instanceTemplates.get",
    "compute.instanceTemplates.useReadOnly",
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.list",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setScheduling",
    "compute.instances.setServiceAccount",
    "compute.instances.setTags",
    "compute.subnetworks.use",
    "compute.zoneOperations.get",
  ]
}

resource "google_project_iam_member" "this" {
  project = var.project_id
  role    = google_project_iam_custom_role.this.id
  member  = "serviceAccount:${google_service_account.this.email}"

  # Instances and disks are only touched when they carry the Nimbus node name prefix;
  # every other resource type (zones, templates, subnetworks, operations) passes.
  condition {
    title       = "nimbus-nodes-only"
    description = "Instances and disks named ${var.node_name_prefix}*"
    expression  = <<-EOT
      (resource.type != "compute.googleapis.com/Instance" || resource.name.extract("/instances/{name}").startsWith("${var.node_name_prefix}")) &&
      (resource.type != "compute.googleapis.com/Disk" || resource.name.extract("/disks/{name}").startsWith("${var.node_name_prefix}"))
    EOT
  }
}

# Launching a node as the GPU service account requires actAs on that account only.
resource "google_service_account_iam_member" "act_as_gpu" {
  for_each = var.gpu_service_account_ids

  service_account_id = each.value
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.this.email}"
}

locals {
  # The role name is the last path segment of the role ARN; STS reports it in the
  # assumed-role ARN the AWS credentials carry.
  aws_role_name = var.aws_workload_identity == null ? null : reverse(split("/", var.aws_workload_identity.role_arn))[0]
}

# Multicloud: the AWS task role exchanges its AWS credentials for a short-lived token
# of this service account; no key file exists anywhere.
resource "google_iam_workload_identity_pool" "aws" {
  count = var.aws_workload_identity == null ? 0 : 1

  project                   = var.project_id
  workload_identity_pool_id = "${var.name}-aws"
  display_name              = "Nimbus control plane in AWS"
}

resource "google_iam_workload_identity_pool_provider" "aws" {
  #checkov:skip=CKV_GCP_125:This provider trusts an AWS account, not GitHub Actions OIDC; attribute_condition admits only the control plane's task role.
  count = var.aws_workload_identity == null ? 0 : 1

  project                            = var.project_id
  workload_identity_pool_id          = google_iam_workload_identity_pool.aws[0].workload_identity_pool_id
  workload_identity_pool_provider_id = "control-plane"
  display_name                       = "Nimbus AWS account"
  attribute_mapping = {
    "google.subject"     = "assertion.arn"
    "attribute.aws_role" = "assertion.arn.extract('assumed-role/{role}/')"
  }
  attribute_condition = "attribute.aws_role == \"${local.aws_role_name}\""

  aws {
    account_id = var.aws_workload_identity.account_id
  }
}

resource "google_service_account_iam_member" "aws_workload_identity" {
  count = var.aws_workload_identity == null ? 0 : 1

  service_account_id = google_service_account.this.id
  role               = "roles/iam.workloadIdentityUser"
  member             = "principalSet://iam.googleapis.com/${google_iam_workload_identity_pool.aws[0].name}/attribute.aws_role/${local.aws_role_name}"
}
