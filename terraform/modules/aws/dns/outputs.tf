output "url" {
  description = "Public HTTPS URL tenants call (latency-routed across regions)."
  value       = "https://${var.record_name}"
}

output "health_check_ids" {
  description = "Route 53 health check id per regional edge."
  value       = { for name, check in aws_route53_health_check.edge : name => check.id }
}
