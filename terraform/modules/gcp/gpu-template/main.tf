locals {
  # Ownership labels the sweeper relies on; the provider adds nimbus-node-id and
  # nimbus-pool-id per launch.
  ownership_labels = {
    managed-by     = "nimbus"
    nimbus-cluster = var.cluster_name
  }
}

resource "google_service_account" "node" {
  project      = var.project_id
  account_id   = substr("${var.name}-gpu-${replace(var.region, "-", "")}", 0, 30)
  display_name = "Nimbus GPU node agent ${var.region}"
}

# What the agent does with Google APIs: write its logs and metrics and read model
# weights from the regional bucket (dataplane/agent/artifacts.py); it never writes there.
resource "google_project_iam_member" "node" {
  for_each = toset(["roles/logging.logWriter", "roles/monitoring.metricWriter"])

  project = var.project_id
  role    = each.key
  member  = "serviceAccount:${google_service_account.node.email}"
}

resource "google_storage_bucket_iam_member" "node" {
  bucket = var.artifact_bucket
  role   = "roles/storage.objectViewer"
  member = "serviceAccount:${google_service_account.node.email}"
}

resource "google_compute_region_instance_template" "this" {
  project      = var.project_id
  name_prefix  = "${var.name}-gpu-${var.region}-"
  region       = var.region
  description  = "Nimbus GPU node; launched by the control plane, never by Terraform"
  machine_type = var.default_machine_type
  tags         = [var.network_tag]
  labels       = merge(var.labels, local.ownership_labels)

  can_ip_forward = false

  disk {
    boot         = true
    source_image = var.boot_image
    disk_size_gb = var.boot_disk_size_gb
    disk_type    = "pd-ssd"
    auto_delete  = true
    labels       = merge(var.labels, local.ownership_labels)

    disk_encryption_key {
      kms_key_self_link = var.kms_key_id
    }
  }

  # No external address: nodes reach the outside through Cloud NAT only.
  network_interface {
    subnetwork = var.subnetwork
  }

  dynamic "guest_accelerator" {
    for_each = var.accelerator == null ? [] : [var.accelerator]
    content {
      type  = guest_accelerator.value.type
      count = guest_accelerator.value.count
    }
  }

  # GPUs cannot live-migrate; the control plane replaces a node under maintenance.
  scheduling {
    on_host_maintenance = "TERMINATE"
    automatic_restart   = false
  }

  shielded_instance_config {
    enable_secure_boot          = var.secure_boot
    enable_vtpm                 = true
    enable_integrity_monitoring = true
  }

  metadata = {
    block-project-ssh-keys = "true"
    enable-oslogin         = "TRUE"
    serial-port-enable     = "false"
  }

  service_account {
    email  = google_service_account.node.email
    scopes = ["cloud-platform"]
  }

  lifecycle {
    create_before_destroy = true
  }
}
