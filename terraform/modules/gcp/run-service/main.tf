# A Cloud Run service reachable only through the global load balancer (serverless
# NEG). Who may call it is decided by the application itself (tenant API keys,
# admin sessions), so Cloud Run's own invoker check is off.
resource "google_cloud_run_v2_service" "this" {
  project              = var.project_id
  name                 = var.name
  location             = var.region
  ingress              = "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"
  invoker_iam_disabled = true
  deletion_protection  = var.deletion_protection
  labels               = var.labels

  template {
    service_account = var.service_account_email
    timeout         = var.request_timeout

    scaling {
      min_instance_count = var.scaling.min
      max_instance_count = var.scaling.max
    }

    vpc_access {
      egress = "PRIVATE_RANGES_ONLY"
      network_interfaces {
        network    = var.network.network
        subnetwork = var.network.subnetwork
        tags       = var.network.tags
      }
    }

    containers {
      image = var.image
      args  = var.args

      ports {
        container_port = var.port
      }

      resources {
        limits = var.resources
        # Streams keep working between requests; CPU stays allocated.
        cpu_idle = false
      }

      dynamic "env" {
        for_each = var.environment
        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = var.secrets
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

      startup_probe {
        http_get {
          path = var.health_check_path
        }
        period_seconds    = 5
        failure_threshold = 24
      }

      liveness_probe {
        http_get {
          path = var.health_check_path
        }
        period_seconds = 15
      }
    }
  }
}

resource "google_compute_region_network_endpoint_group" "this" {
  project               = var.project_id
  name                  = var.name
  region                = var.region
  network_endpoint_type = "SERVERLESS"

  cloud_run {
    service = google_cloud_run_v2_service.this.name
  }
}
