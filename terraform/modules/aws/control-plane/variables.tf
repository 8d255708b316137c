variable "name" {
  type        = string
  description = "Name prefix for every resource, e.g. \"nimbus\" (at most 16 characters)."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,15}$", var.name))
    error_message = "Use 2-16 lower-case letters, digits or dashes, starting with a letter."
  }
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster tag on every node this control plane launches; its IAM permissions are scoped to it."
}

variable "image" {
  type        = string
  description = "Container image (one image for API, worker and beat), pinned by tag or digest."
}

variable "vpc_id" {
  type        = string
  description = "VPC of the control plane (from the network module of its region)."
}

variable "vpc_cidr" {
  type        = string
  description = "CIDR of that VPC."
}

variable "peer_cidrs" {
  type        = list(string)
  description = "CIDRs of peered VPCs whose edges reach Redis (other regions of this deployment)."
  default     = []
}

variable "node_cidrs" {
  type        = list(string)
  description = "CIDRs where GPU nodes live (this VPC and peered ones); the control plane calls their agents."
}

variable "batch_bucket" {
  type = object({
    id          = string
    arn         = string
    kms_key_arn = string
  })
  description = "Artifact bucket of the control plane's region (name, ARN, the KMS key it is encrypted with); the Batch API keeps its files under its batches/ prefix."
}

variable "agent_port" {
  type        = number
  description = "Port of the node agent on GPU nodes."
  default     = 8479
}

variable "private_subnet_ids" {
  type        = list(string)
  description = "Private subnets (two zones or more) for the services, Postgres and Redis."
}

variable "public_subnet_ids" {
  type        = list(string)
  description = "Public subnets for the API load balancer."
}

variable "kms_key_arn" {
  type        = string
  description = "ARN of the regional KMS key that encrypts Postgres, Redis, secrets and logs."
}

variable "log_bucket_id" {
  type        = string
  description = "Regional log bucket for the load balancer's access logs."
}

variable "zone_id" {
  type        = string
  description = "Route 53 hosted zone that holds domain_name."
}

variable "domain_name" {
  type        = string
  description = "Fully qualified name of the control plane API and console, e.g. cp.nimbus.example.com."
}

variable "api_port" {
  type        = number
  description = "Port the API container listens on."
  default     = 8000
}

variable "api_count" {
  type        = number
  description = "Number of API tasks."
  default     = 2
}

variable "worker_count" {
  type        = number
  description = "Number of Celery worker tasks."
  default     = 2
}

variable "batch_worker_count" {
  type        = number
  description = "Number of Celery batch worker tasks (the batches queue; each runs NIMBUS_BATCH_WORKER_CONCURRENCY batches at once, 2 unless set)."
  default     = 1
}

variable "batch_edge_url" {
  type        = string
  description = "Edge the batch workers send Batch API lines through (NIMBUS_BATCH_EDGE_URL), e.g. the primary region's edge https://us-east-1.api.nimbus.example.com."
}

variable "task_size" {
  type = object({
    cpu    = number
    memory = number
  })
  description = "CPU units and memory (MiB) of each API, worker and batch worker task."
  default     = { cpu = 1024, memory = 2048 }
}

variable "db_instance_class" {
  type        = string
  description = "RDS instance class of the Postgres database."
  default     = "db.r6g.large"
}

variable "db_allocated_storage_gb" {
  type        = number
  description = "Initial Postgres storage in GiB; it grows automatically up to ten times this."
  default     = 100
}

variable "db_engine_version" {
  type        = string
  description = "Postgres major version."
  default     = "16"
}

variable "redis_node_type" {
  type        = string
  description = "ElastiCache node type of the Redis replication group (broker, limits, usage stream)."
  default     = "cache.r7g.large"
}

variable "gpu_launch_template_arns" {
  type        = list(string)
  description = "ARNs of the GPU launch templates (all regions) the control plane may launch from."
}

variable "gpu_instance_role_arns" {
  type        = list(string)
  description = "ARNs of the GPU node roles (all regions) the control plane may pass to instances."
}

variable "gpu_vpc_arns" {
  type        = list(string)
  description = "ARNs of the VPCs GPU nodes may be launched into."
}

variable "gpu_kms_key_arns" {
  type        = list(string)
  description = "ARNs of the KMS keys that encrypt GPU node volumes (launching with a customer key needs grants on it)."
}

variable "environment" {
  type        = map(string)
  description = "Extra plain environment variables for all control plane roles (never secrets)."
  default     = {}
}

variable "log_retention_days" {
  type        = number
  description = "Days service, database and Redis logs are kept."
  default     = 365
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the database and load balancer from deletion."
  default     = true
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
