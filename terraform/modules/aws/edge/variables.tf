variable "name" {
  type        = string
  description = "Name prefix, e.g. \"nimbus\"; the edge becomes <name>-edge-<region>."
}

variable "short_name" {
  type        = string
  description = "Short unique name for the load balancer (at most 20 characters), e.g. nimbus-edge-use1."

  validation {
    condition     = length(var.short_name) <= 20
    error_message = "At most 20 characters (load balancer name limits)."
  }
}

variable "image" {
  type        = string
  description = "Container image (the shared Nimbus image, run with the edge command)."
}

variable "domain_name" {
  type        = string
  description = "Regional name of this edge, e.g. us-east-1.api.nimbus.example.com (the latency record points here)."
}

variable "global_domain_name" {
  type        = string
  description = "Latency-routed name tenants call, e.g. api.nimbus.example.com; the edge certificate covers it too."
}

variable "zone_id" {
  type        = string
  description = "Route 53 hosted zone that holds domain_name."
}

variable "vpc_id" {
  type        = string
  description = "VPC of the region."
}

variable "vpc_cidr" {
  type        = string
  description = "CIDR of that VPC."
}

variable "public_subnet_ids" {
  type        = list(string)
  description = "Public subnets for the edge load balancer."
}

variable "private_subnet_ids" {
  type        = list(string)
  description = "Private subnets for the edge tasks."
}

variable "port" {
  type        = number
  description = "Port the edge container listens on."
  default     = 8080
}

variable "desired_count" {
  type        = number
  description = "Number of edge tasks (stateless, so scale freely)."
  default     = 2
}

variable "task_size" {
  type = object({
    cpu    = number
    memory = number
  })
  description = "CPU units and memory (MiB) of each edge task."
  default     = { cpu = 1024, memory = 2048 }
}

variable "control_plane_url" {
  type        = string
  description = "HTTPS URL of the control plane; the edge pulls routing snapshots from it."
}

variable "redis_cidr" {
  type        = string
  description = "CIDR of the control plane's VPC, where Redis lives (this VPC or a peered one)."
}

variable "redis_port" {
  type        = number
  description = "Port of the control plane's Redis (its URL, with the AUTH token, comes as the NIMBUS_EDGE_REDIS_URL secret)."
  default     = 6379
}

variable "secrets" {
  type        = map(string)
  description = "Environment variables filled from Secrets Manager, NIMBUS_EDGE_TOKEN and NIMBUS_EDGE_REDIS_URL: name => secret ARN (may be in the control plane's region)."
}

variable "secrets_kms_key_arn" {
  type        = string
  description = "ARN of the KMS key that encrypts those secrets."
}

variable "node_cidrs" {
  type        = list(string)
  description = "CIDRs where GPU nodes live (this VPC, peered VPCs, another cloud over VPN): the edge connects to engines there."
}

variable "engine_ports" {
  type = object({
    from = number
    to   = number
  })
  description = "Port range of the engines on GPU nodes."
  default     = { from = 30000, to = 30015 }
}

variable "agent_port" {
  type        = number
  description = "Port of the node agent on GPU nodes."
  default     = 8479
}

variable "kms_key_arn" {
  type        = string
  description = "ARN of the regional KMS key that encrypts the edge's logs."
}

variable "log_bucket_id" {
  type        = string
  description = "Regional log bucket for the load balancer's access logs."
}

variable "log_retention_days" {
  type        = number
  description = "Days edge logs are kept."
  default     = 365
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the load balancer from deletion."
  default     = true
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
