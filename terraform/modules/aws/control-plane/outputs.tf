output "url" {
  description = "Public HTTPS URL of the control plane API and console."
  value       = module.alb.url
}

output "alb_dns_name" {
  description = "AWS DNS name of the control plane load balancer."
  value       = module.alb.dns_name
}

output "ecs_cluster_arn" {
  description = "ECS cluster running the API, worker and beat services."
  value       = aws_ecs_cluster.this.arn
}

output "services_security_group_id" {
  description = "Security group of the control plane tasks (GPU nodes admit the agent port from it)."
  value       = aws_security_group.services.id
}

output "task_role_arn" {
  description = "Role the control plane runs as (the AWS provider's identity)."
  value       = aws_iam_role.task.arn
}

output "database_endpoint" {
  description = "Postgres endpoint (host:port)."
  value       = aws_db_instance.this.endpoint
}

output "redis_host" {
  description = "Primary endpoint of the Redis replication group (TLS)."
  value       = aws_elasticache_replication_group.this.primary_endpoint_address
}

output "redis_port" {
  description = "Port of the Redis replication group."
  value       = aws_elasticache_replication_group.this.port
}

output "edge_secret_arns" {
  description = "Secrets an edge needs, by the environment variable the edge reads."
  value = {
    NIMBUS_EDGE_TOKEN     = aws_secretsmanager_secret.this["edge-token"].arn
    NIMBUS_EDGE_REDIS_URL = aws_secretsmanager_secret.this["redis-url"].arn
  }
}

output "edge_secret_values" {
  description = "Values of the edge secrets, for copying into another cloud's secret store (multicloud)."
  value = {
    NIMBUS_EDGE_TOKEN     = local.secret_values["edge-token"]
    NIMBUS_EDGE_REDIS_URL = local.secret_values["redis-url"]
  }
  sensitive = true
}
