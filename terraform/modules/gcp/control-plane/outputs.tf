output "url" {
  description = "Public HTTPS URL of the control plane API and console (a host rule of the global load balancer)."
  value       = "https://${var.domain_name}"
}

output "api_neg_id" {
  description = "Serverless network endpoint group of the API (the global load balancer routes the control plane host to it)."
  value       = module.api.neg_id
}

output "redis" {
  description = "Memorystore endpoint (TLS with server authentication)."
  value = {
    host = google_redis_instance.this.host
    port = google_redis_instance.this.port
  }
}

output "redis_ca_certificate" {
  description = "CA certificate that verifies Memorystore's TLS certificate."
  value       = google_redis_instance.this.server_ca_certs[0].cert
}

output "edge_secret_ids" {
  description = "Secret Manager secrets edges need, by environment variable name."
  value = {
    NIMBUS_REDIS_PASSWORD = local.secret_ids["redis-auth"]
    NIMBUS_SECRET_KEY     = local.secret_ids["app-key"]
  }
}

output "database_connection_name" {
  description = "Cloud SQL connection name (project:region:instance)."
  value       = google_sql_database_instance.this.connection_name
}
