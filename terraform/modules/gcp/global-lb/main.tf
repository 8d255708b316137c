locals {
  control_plane_hosts = var.control_plane == null ? [] : [var.control_plane.domain_name]
  hostnames = concat(
    [var.api_domain_name],
    [for edge in values(var.edges) : edge.domain_name],
    local.control_plane_hosts,
  )
}

resource "google_compute_global_address" "this" {
  project = var.project_id
  name    = var.name
}

resource "google_compute_security_policy" "this" {
  project     = var.project_id
  name        = var.name
  description = "Coarse per-IP throttling and known-exploit filters in front of the edges"

  rule {
    action      = "throttle"
    priority    = 1000
    description = "Per-IP request throttle"
    match {
      versioned_expr = "SRC_IPS_V1"
      config {
        src_ip_ranges = ["*"]
      }
    }
    rate_limit_options {
      conform_action = "allow"
      exceed_action  = "deny(429)"
      enforce_on_key = "IP"
      rate_limit_threshold {
        count        = var.rate_limit_per_ip
        interval_sec = 60
      }
    }
  }

  rule {
    action      = "deny(403)"
    priority    = 900
    description = "Log4j exploit attempts"
    match {
      expr {
        expression = "evaluatePreconfiguredWaf('cve-canary')"
      }
    }
  }

  rule {
    action      = "allow"
    priority    = 2147483647
    description = "Default: allow"
    match {
      versioned_expr = "SRC_IPS_V1"
      config {
        src_ip_ranges = ["*"]
      }
    }
  }
}

# One backend over every edge: the load balancer picks the closest healthy region. Serverless NEGs
# (Cloud Run) take no health check here; the edges' model-level readiness (/health/ready) is probed
# by the Route 53 health checks of the latency records (modules/aws/dns).
resource "google_compute_backend_service" "all_edges" {
  project               = var.project_id
  name                  = "${var.name}-edges"
  protocol              = "HTTPS"
  load_balancing_scheme = "EXTERNAL_MANAGED"
  security_policy       = google_compute_security_policy.this.id

  dynamic "backend" {
    for_each = var.edges
    content {
      group = backend.value.neg_id
    }
  }

  log_config {
    enable      = true
    sample_rate = 1
  }
}

# One backend per edge, for the regional names written into the cloud catalog.
resource "google_compute_backend_service" "edge" {
  for_each = var.edges

  project               = var.project_id
  name                  = "${var.name}-edge-${each.key}"
  protocol              = "HTTPS"
  load_balancing_scheme = "EXTERNAL_MANAGED"
  security_policy       = google_compute_security_policy.this.id

  backend {
    group = each.value.neg_id
  }

  log_config {
    enable      = true
    sample_rate = 1
  }
}

resource "google_compute_backend_service" "control_plane" {
  count = var.control_plane == null ? 0 : 1

  project               = var.project_id
  name                  = "${var.name}-control-plane"
  protocol              = "HTTPS"
  load_balancing_scheme = "EXTERNAL_MANAGED"
  security_policy       = google_compute_security_policy.this.id

  backend {
    group = var.control_plane.neg_id
  }

  log_config {
    enable      = true
    sample_rate = 1
  }
}

resource "google_compute_url_map" "this" {
  project         = var.project_id
  name            = var.name
  default_service = google_compute_backend_service.all_edges.id

  dynamic "host_rule" {
    for_each = var.edges
    content {
      hosts        = [host_rule.value.domain_name]
      path_matcher = "edge-${host_rule.key}"
    }
  }

  dynamic "path_matcher" {
    for_each = var.edges
    content {
      name            = "edge-${path_matcher.key}"
      default_service = google_compute_backend_service.edge[path_matcher.key].id
    }
  }

  dynamic "host_rule" {
    for_each = google_compute_backend_service.control_plane
    content {
      hosts        = local.control_plane_hosts
      path_matcher = "control-plane"
    }
  }

  dynamic "path_matcher" {
    for_each = google_compute_backend_service.control_plane
    content {
      name            = "control-plane"
      default_service = path_matcher.value.id
    }
  }
}

resource "google_compute_managed_ssl_certificate" "this" {
  project = var.project_id
  name    = "${var.name}-${substr(sha256(join(",", local.hostnames)), 0, 8)}"

  managed {
    domains = local.hostnames
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_ssl_policy" "this" {
  project         = var.project_id
  name            = var.name
  profile         = "RESTRICTED"
  min_tls_version = "TLS_1_2"
}

resource "google_compute_target_https_proxy" "this" {
  project          = var.project_id
  name             = var.name
  url_map          = google_compute_url_map.this.id
  ssl_certificates = [google_compute_managed_ssl_certificate.this.id]
  ssl_policy       = google_compute_ssl_policy.this.id
}

resource "google_compute_global_forwarding_rule" "https" {
  project               = var.project_id
  name                  = "${var.name}-https"
  target                = google_compute_target_https_proxy.this.id
  ip_address            = google_compute_global_address.this.address
  port_range            = "443"
  load_balancing_scheme = "EXTERNAL_MANAGED"
}

resource "google_dns_record_set" "this" {
  for_each = var.dns_managed_zone == null ? toset([]) : toset(local.hostnames)

  project      = var.project_id
  managed_zone = var.dns_managed_zone
  name         = "${each.key}."
  type         = "A"
  ttl          = 300
  rrdatas      = [google_compute_global_address.this.address]
}
