data "google_project" "this" {
  project_id = var.project_id
}

data "google_storage_project_service_account" "this" {
  project = var.project_id
}

resource "google_project_service_identity" "sqladmin" {
  provider = google-beta
  project  = var.project_id
  service  = "sqladmin.googleapis.com"
}

locals {
  number = data.google_project.this.number
  # Google-managed service agents that encrypt Nimbus data with the regional key.
  service_agents = {
    compute        = "serviceAccount:service-${local.number}@compute-system.iam.gserviceaccount.com"
    storage        = "serviceAccount:${data.google_storage_project_service_account.this.email_address}"
    cloudsql       = "serviceAccount:${google_project_service_identity.sqladmin.email}"
    memorystore    = "serviceAccount:service-${local.number}@cloud-redis.iam.gserviceaccount.com"
    secret_manager = "serviceAccount:service-${local.number}@gcp-sa-secretmanager.iam.gserviceaccount.com"
  }
  grants = merge([
    for region in var.regions : {
      for agent, member in local.service_agents : "${region}-${agent}" => { region = region, member = member }
    }
  ]...)
}

resource "google_kms_key_ring" "this" {
  for_each = toset(var.regions)

  project  = var.project_id
  name     = "${var.name}-${each.key}"
  location = each.key
}

resource "google_kms_crypto_key" "this" {
  for_each = google_kms_key_ring.this

  name            = "${var.name}-data"
  key_ring        = each.value.id
  rotation_period = var.rotation_period
  labels          = var.labels

  # Destroying a key destroys every disk, database and object encrypted with it.
  lifecycle {
    prevent_destroy = true
  }
}

resource "google_kms_crypto_key_iam_member" "service_agents" {
  for_each = local.grants

  crypto_key_id = google_kms_crypto_key.this[each.value.region].id
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = each.value.member
}
