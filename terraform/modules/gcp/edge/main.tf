locals {
  full_name = "${var.name}-edge-${var.region}"
}

# The edge calls no Google API; its identity only reads its own secrets.
resource "google_service_account" "edge" {
  project      = var.project_id
  account_id   = substr("${var.name}-edge-${replace(var.region, "-", "")}", 0, 30)
  display_name = "Nimbus edge ${var.region}"
}

resource "google_secret_manager_secret_iam_member" "edge" {
  for_each = var.secrets

  project   = var.project_id
  secret_id = each.value
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.edge.email}"
}

module "service" {
  source = "../run-service"

  project_id            = var.project_id
  name                  = local.full_name
  region                = var.region
  image                 = var.image
  args                  = ["edge"]
  port                  = var.port
  service_account_email = google_service_account.edge.email
  # The edge's settings (dataplane/edge/settings.py) as NIMBUS_EDGE_* variables.
  environment = merge(
    {
      NIMBUS_CONTROL_PLANE_URL = var.control_plane_url
      NIMBUS_EDGE_HOST         = "0.0.0.0"
      NIMBUS_EDGE_PORT         = tostring(var.port)
      NIMBUS_EDGE_REGION       = var.region
      NIMBUS_EDGE_STATE_DIR    = "/tmp/edge"
    },
    var.redis_ca_pem == null ? {} : { NIMBUS_REDIS_CA_PEM = var.redis_ca_pem },
  )
  secrets         = var.secrets
  network         = var.network
  scaling         = var.scaling
  request_timeout = "3600s"
  # Cloud Run's startup and liveness probes: /health (the process answers), never the model-level
  # /health/ready, which would restart healthy edges during a model outage. Model-level steering of
  # this edge is Route 53's /health/ready check (modules/aws/platform, external_endpoints): the global
  # load balancer's serverless NEGs take no health check.
  health_check_path   = "/health"
  deletion_protection = var.deletion_protection
  labels              = var.labels

  depends_on = [google_secret_manager_secret_iam_member.edge]
}
