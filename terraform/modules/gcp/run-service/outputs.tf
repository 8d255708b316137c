output "name" {
  description = "Name of the Cloud Run service."
  value       = google_cloud_run_v2_service.this.name
}

output "uri" {
  description = "Cloud Run's own URI of the service (reachable only through the load balancer)."
  value       = google_cloud_run_v2_service.this.uri
}

output "neg_id" {
  description = "Serverless network endpoint group the global load balancer routes to."
  value       = google_compute_region_network_endpoint_group.this.id
}
