locals {
  bucket_name = "${var.project_id}-${var.name}-artifacts-${var.region}"
}

# Model weights live next to the GPUs that load them (artifact reuse): a node pulls
# from its own region's bucket over Private Google Access.
resource "google_storage_bucket" "this" {
  project                     = var.project_id
  name                        = local.bucket_name
  location                    = upper(var.region)
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  labels                      = var.labels

  versioning {
    enabled = true
  }

  encryption {
    default_kms_key_name = var.kms_key_id
  }

  logging {
    log_bucket        = google_storage_bucket.access_logs.name
    log_object_prefix = local.bucket_name
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.noncurrent_version_days
    }
    action {
      type = "Delete"
    }
  }
}

resource "google_storage_bucket" "access_logs" {
  #checkov:skip=CKV_GCP_62:This bucket is the access-log sink; logging it into itself would loop.
  project                     = var.project_id
  name                        = "${local.bucket_name}-logs"
  location                    = upper(var.region)
  storage_class               = "STANDARD"
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  labels                      = var.labels

  versioning {
    enabled = true
  }

  encryption {
    default_kms_key_name = var.kms_key_id
  }

  lifecycle_rule {
    condition {
      age = 400
    }
    action {
      type = "Delete"
    }
  }
}

# Cloud Storage writes usage logs as this group.
resource "google_storage_bucket_iam_member" "access_log_writer" {
  bucket = google_storage_bucket.access_logs.name
  role   = "roles/storage.objectCreator"
  member = "group:cloud-storage-analytics@google.com"
}
