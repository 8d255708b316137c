output "url" {
  description = "Public HTTPS URL of the control plane API and console (a host rule of the global load balancer)."
  value       = "https://${var.domain_name}"
}

output "api_neg_id" {
  description = "Serverless network endpoint group of the API (the global load balancer routes the control plane host to it)."
  value       = module.api.neg_id
}

output "redis_ca_certificate" {
  description = "CA certificate that verifies Memorystore's TLS certificate (edges get it as NIMBUS_REDIS_CA_PEM)."
  value       = google_redis_instance.this.server_ca_certs[0].cert
}

output "edge_secret_ids" {
  description = "Secret Manager secrets an edge needs, by the environment variable the edge reads."
  value = {
    NIMBUS_EDGE_TOKEN     = local.secret_ids["edge-token"]
    NIMBUS_EDGE_REDIS_URL = local.secret_ids["redis-url"]
  }
}

output "database_connection_name" {
  description = "Cloud SQL connection name (project:region:instance)."
  value       = google_sql_database_instance.this.connection_name
}
