locals {
  # What every role (api, worker, beat) is told about its surroundings; secrets come
  # from Secret Manager.
  environment = {
    NIMBUS_CLOUD            = "gcp"
    NIMBUS_CLUSTER          = var.cluster_name
    NIMBUS_PUBLIC_URL       = "https://${var.domain_name}"
    NIMBUS_GCP_PROJECT      = var.project_id
    NIMBUS_DATABASE_HOST    = google_sql_database_instance.this.private_ip_address
    NIMBUS_DATABASE_PORT    = "5432"
    NIMBUS_DATABASE_NAME    = google_sql_database.nimbus.name
    NIMBUS_DATABASE_USER    = google_sql_user.nimbus.name
    NIMBUS_DATABASE_SSLMODE = "require"
    NIMBUS_REDIS_HOST       = google_redis_instance.this.host
    NIMBUS_REDIS_PORT       = tostring(google_redis_instance.this.port)
    NIMBUS_REDIS_TLS        = "true"
  }
  secrets = {
    NIMBUS_DATABASE_PASSWORD = local.secret_ids["database-password"]
    NIMBUS_REDIS_PASSWORD    = local.secret_ids["redis-auth"]
    NIMBUS_SECRET_KEY        = local.secret_ids["app-key"]
  }

  # Exactly one beat: two schedulers would fire every periodic task twice.
  background_roles = {
    worker = { args = ["worker"], instances = var.worker_count }
    beat   = { args = ["beat"], instances = 1 }
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

# Celery worker and beat pull work from Redis and serve no HTTP, so they run as Cloud
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
        for_each = local.environment
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
