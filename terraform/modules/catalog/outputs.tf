output "json" {
  description = "The cloud catalog as JSON, ready for `nimbus catalog import`."
  value       = jsonencode(local.catalog)
}

output "catalog" {
  description = "The cloud catalog as a Terraform value."
  value       = local.catalog
}
