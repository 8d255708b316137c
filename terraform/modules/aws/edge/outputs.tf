output "url" {
  description = "Regional HTTPS URL of the edge, as written into the cloud catalog."
  value       = module.alb.url
}

output "alb_dns_name" {
  description = "AWS DNS name of the edge load balancer (latency record alias target)."
  value       = module.alb.dns_name
}

output "alb_zone_id" {
  description = "Hosted zone id of the edge load balancer (latency record alias target)."
  value       = module.alb.zone_id
}

output "security_group_id" {
  description = "Security group of the edge tasks (GPU nodes admit engine traffic from it)."
  value       = aws_security_group.edge.id
}

output "domain_name" {
  description = "Regional name of this edge."
  value       = var.domain_name
}
