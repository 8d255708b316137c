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
