output "launch_template_id" {
  description = "Id of the launch template (lt-…), as written into the cloud catalog."
  value       = aws_launch_template.this.id
}

output "launch_template_arn" {
  description = "ARN of the launch template (scopes the control plane's RunInstances permission)."
  value       = aws_launch_template.this.arn
}

output "launch_template_name" {
  description = "Name of the launch template."
  value       = aws_launch_template.this.name
}

output "launch_template_version" {
  description = "Latest version of the launch template."
  value       = tostring(aws_launch_template.this.latest_version)
}

output "node_role_arn" {
  description = "ARN of the node role (the control plane needs iam:PassRole on it)."
  value       = aws_iam_role.node.arn
}

output "security_group_id" {
  description = "Security group of the GPU nodes."
  value       = aws_security_group.node.id
}
