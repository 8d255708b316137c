output "api_url" {
  description = "Latency-routed HTTPS URL tenants call."
  value       = module.aws.api_url
}

output "control_plane_url" {
  description = "HTTPS URL of the control plane API and console."
  value       = module.aws.control_plane_url
}

output "cloud_catalog" {
  description = "Cloud catalog JSON for `nimbus catalog import` (schema: infra/catalog/schema.json)."
  value       = module.catalog.json
}
