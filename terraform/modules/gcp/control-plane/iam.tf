# The runtime identity (with its Compute permissions) comes from the provisioner
# module; here it only gains what running the control plane needs.

locals {
  member = "serviceAccount:${var.service_account_email}"
}

resource "google_project_iam_member" "cloudsql_client" {
  project = var.project_id
  role    = "roles/cloudsql.client"
  member  = local.member
}

resource "google_secret_manager_secret_iam_member" "control_plane" {
  for_each = local.secret_ids

  project   = var.project_id
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = local.member
}

# The Batch API's files (tenant JSONL input, output and error files) live under the
# batches/ prefix of the region's artifact bucket. objectUser covers create, get and
# delete (an overwrite is a delete plus a create); the condition confines it to that
# prefix, so the model weights stay out of reach. Listing is checked against the
# bucket, not an object, and so is not granted; the store never lists.
resource "google_storage_bucket_iam_member" "batch_files" {
  bucket = var.artifact_bucket
  role   = "roles/storage.objectUser"
  member = local.member

  condition {
    title       = "batch-files-only"
    description = "Objects under batches/ only"
    expression  = "resource.name.startsWith(\"projects/_/buckets/${var.artifact_bucket}/objects/${local.batch_prefix}/\")"
  }
}
