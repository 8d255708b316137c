output "api_url" {
  description = "Latency-routed HTTPS URL tenants call."
  value       = module.dns.url
}

output "control_plane_url" {
  description = "HTTPS URL of the control plane API and console."
  value       = module.control_plane.url
}

output "control_plane_role_arn" {
  description = "Role the control plane runs as (trusted by GCP workload identity in multicloud)."
  value       = module.control_plane.task_role_arn
}

output "edge_secret_arns" {
  description = "Secrets edges need, by environment variable name."
  value       = local.edge_secrets
}

output "catalog_regions" {
  description = "Cloud catalog entries of both regions, without instance_types."
  value       = [module.primary.catalog_region, module.secondary.catalog_region]
}

output "edge_secret_values" {
  description = "Values of the edge secrets, for copying into another cloud's secret store (multicloud)."
  value       = module.control_plane.edge_secret_values
  sensitive   = true
}

output "account_id" {
  description = "AWS account of the deployment."
  value       = data.aws_caller_identity.current.account_id
}

output "primary_network" {
  description = "VPC of the primary region (control plane): id, CIDR and private route tables (a VPN to another cloud attaches here)."
  value = {
    vpc_id                  = module.primary.network.vpc_id
    cidr_block              = module.primary.network.cidr_block
    private_route_table_ids = module.primary.network.private_route_table_ids
  }
}

output "primary_kms_key_arn" {
  description = "KMS key of the primary region."
  value       = module.kms_primary.key_arn
}
