output "url" {
  description = "Regional HTTPS URL of the edge (a host rule of the global load balancer), as written into the cloud catalog."
  value       = "https://${var.domain_name}"
}

output "domain_name" {
  description = "Regional name of this edge."
  value       = var.domain_name
}

output "neg_id" {
  description = "Serverless network endpoint group of the edge."
  value       = module.service.neg_id
}
