locals {
  batch_prefix = "batches"

  # What every role (api, worker, batch-worker, beat) is told about its surroundings, in the
  # NIMBUS_* variables of controlplane/config.py. Credentials come as secrets.
  environment = {
    NIMBUS_PUBLIC_URL   = "https://${var.domain_name}"
    NIMBUS_CLUSTER_NAME = var.cluster_name
    NIMBUS_STATE_DIR    = "/tmp/nimbus"
    NIMBUS_API_PORT     = tostring(var.api_port)
    NIMBUS_GCP_PROJECT  = var.project_id
    NIMBUS_REDIS_CA_PEM = google_redis_instance.this.server_ca_certs[0].cert
    # Batch API files (infra/objectstore.py); the bucket's default CMEK key encrypts them.
    NIMBUS_BATCH_STORE_URL = "gs://${var.artifact_bucket}/${local.batch_prefix}"
  }
  secrets = {
    NIMBUS_DATABASE_URL   = local.secret_ids["database-url"]
    NIMBUS_BROKER_URL     = local.secret_ids["broker-url"]
    NIMBUS_REDIS_URL      = local.secret_ids["redis-url"]
    NIMBUS_ADMIN_TOKEN    = local.secret_ids["admin-token"]
    NIMBUS_EDGE_TOKEN     = local.secret_ids["edge-token"]
    NIMBUS_SESSION_SECRET = local.secret_ids["session-secret"]
  }

  # The worker consumes the default `celery` queue (the fleet's short ticks), the batch
  # worker the `batches` queue only (Batch API runs that can take hours, each line sent
  # through the control plane region's edge). Exactly one beat: two schedulers would fire
  # every periodic task twice. environment adds a role's own variables to the shared ones.
  background_roles = {
    worker       = { args = ["worker"], instances = var.worker_count, environment = {} }
    batch-worker = { args = ["batch-worker"], instances = var.batch_worker_count, environment = { NIMBUS_BATCH_EDGE_URL = var.batch_edge_url } }
    beat         = { args = ["beat"], instances = 1, environment = {} }
  }
}

module "api" {
  source = "../run-service"

  project_id            = var.project_id
  name                  = "${var.name}-api"
  region                = var.region
  image                 = var.image
  args                  = ["api"]
  port                  = var.api_port
  service_account_email = var.service_account_email
  environment           = local.environment
  secrets               = local.secrets
  network = {
    network    = var.network.network_id
    subnetwork = var.network.subnetwork
    tags       = [var.network.network_tag]
  }
  scaling             = var.api_scaling
  request_timeout     = "300s"
  deletion_protection = var.deletion_protection
  labels              = var.labels

  depends_on = [google_secret_manager_secret_iam_member.control_plane, google_secret_manager_secret_version.this]
}

# Celery workers and beat pull work from Redis and serve no HTTP, so they run as Cloud
# Run worker pools (a preview launch stage at the time of writing) with a fixed size.
resource "google_cloud_run_v2_worker_pool" "background" {
  for_each = local.background_roles

  project             = var.project_id
  name                = "${var.name}-${each.key}"
  location            = var.region
  launch_stage        = "BETA"
  deletion_protection = var.deletion_protection
  labels              = var.labels

  scaling {
    scaling_mode          = "MANUAL"
    manual_instance_count = each.value.instances
  }

  template {
    service_account = var.service_account_email

    vpc_access {
      egress = "PRIVATE_RANGES_ONLY"
      network_interfaces {
        network    = var.network.network_id
        subnetwork = var.network.subnetwork
        tags       = [var.network.network_tag]
      }
    }

    containers {
      image = var.image
      args  = each.value.args

      resources {
        limits = { cpu = "2", memory = "2Gi" }
      }

      dynamic "env" {
        for_each = merge(local.environment, each.value.environment)
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = local.secrets
        content {
          name = env.key
          value_source {
            secret_key_ref {
              secret  = env.value
              version = "latest"
            }
          }
        }
      }
    }
  }

  depends_on = [google_secret_manager_secret_iam_member.control_plane, google_secret_manager_secret_version.this]
}
