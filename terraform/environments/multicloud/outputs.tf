output "api_url" {
  description = "Latency-routed HTTPS URL tenants call (AWS and GCP edges)."
  value       = module.aws.api_url
}

output "control_plane_url" {
  description = "HTTPS URL of the control plane API and console (AWS)."
  value       = module.aws.control_plane_url
}

output "gcp_workload_identity_provider" {
  description = "Workload identity provider the control plane exchanges its AWS credentials with to call Compute Engine as the provisioner service account."
  value       = module.gcp.workload_identity_provider
}

output "gcp_provisioner_service_account" {
  description = "Service account the control plane impersonates in GCP."
  value       = module.gcp.provisioner_service_account
}

output "cloud_catalog" {
  description = "Cloud catalog JSON for `nimbus catalog import` (schema: infra/catalog/schema.json)."
  value       = module.catalog.json
}
