output "arn" {
  description = "ARN of the load balancer."
  value       = aws_lb.this.arn
}

output "dns_name" {
  description = "AWS DNS name of the load balancer (Route 53 alias target)."
  value       = aws_lb.this.dns_name
}

output "zone_id" {
  description = "Hosted zone id of the load balancer (Route 53 alias target)."
  value       = aws_lb.this.zone_id
}

output "security_group_id" {
  description = "Security group of the load balancer; targets admit traffic from it."
  value       = aws_security_group.alb.id
}

output "target_group_arn" {
  description = "Target group the service registers its tasks in."
  value       = aws_lb_target_group.this.arn
}

output "url" {
  description = "Public HTTPS URL the load balancer serves."
  value       = "https://${var.domain_name}"
}

output "listener_arn" {
  description = "ARN of the HTTPS listener (the service waits for it before registering)."
  value       = aws_lb_listener.https.arn
}
