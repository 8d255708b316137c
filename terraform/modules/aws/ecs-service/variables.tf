variable "name" {
  type        = string
  description = "Service name, e.g. nimbus-api; also the container and log group name."
}

variable "cluster_arn" {
  type        = string
  description = "ECS cluster the service runs in."
}

variable "image" {
  type        = string
  description = "Container image reference (registry/repository:tag or @digest); the same image serves every role."
}

variable "command" {
  type        = list(string)
  description = "Command that selects the role inside the shared image, e.g. [\"api\"] or [\"worker\"]."
}

variable "environment" {
  type        = map(string)
  description = "Plain environment variables (never secrets)."
  default     = {}
}

variable "secrets" {
  type        = map(string)
  description = "Environment variables filled from Secrets Manager at start: name => secret ARN (optionally with :json-key:: suffix)."
  default     = {}
}

variable "cpu" {
  type        = number
  description = "Task CPU units (1024 = one vCPU)."
  default     = 512
}

variable "memory" {
  type        = number
  description = "Task memory in MiB."
  default     = 1024
}

variable "desired_count" {
  type        = number
  description = "Number of tasks to keep running."
  default     = 2
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets the tasks run in."
}

variable "security_group_ids" {
  type        = list(string)
  description = "Security groups attached to the tasks."
}

variable "execution_role_arn" {
  type        = string
  description = "Role ECS uses to pull the image, write logs and read the secrets."
}

variable "task_role_arn" {
  type        = string
  description = "Role the application itself runs as."
}

variable "load_balancer" {
  type = object({
    target_group_arn = string
    container_port   = number
  })
  description = "Target group to register tasks in and the container port it forwards to; null for services without inbound traffic (worker, beat)."
  default     = null
}

variable "health_check_grace_period_seconds" {
  type        = number
  description = "Seconds the load balancer health check is ignored after a task starts."
  default     = 60
}

variable "kms_key_arn" {
  type        = string
  description = "ARN of the regional KMS key that encrypts the log group."
}

variable "log_retention_days" {
  type        = number
  description = "Days container logs are kept."
  default     = 365
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
