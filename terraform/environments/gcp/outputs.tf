output "api_url" {
  description = "HTTPS URL tenants call (anycast, nearest edge)."
  value       = module.gcp.api_url
}

output "control_plane_url" {
  description = "HTTPS URL of the control plane API and console."
  value       = module.gcp.control_plane_url
}

output "cloud_catalog" {
  description = "Cloud catalog JSON for `nimbus catalog import` (schema: infra/catalog/schema.json)."
  value       = module.catalog.json
}
