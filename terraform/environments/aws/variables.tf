variable "name" {
  type        = string
  description = "Name prefix for every resource (2-16 lower-case characters)."
  default     = "nimbus"
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster tag on GPU nodes; one per deployment."
}

variable "image" {
  type        = string
  description = "Shared Nimbus container image, pinned by tag or digest (e.g. an ECR repository URI)."
}

variable "domain" {
  type        = string
  description = "Public Route 53 hosted zone Nimbus lives under, e.g. nimbus.example.com."
}

variable "primary" {
  type = object({
    region             = string
    cidr_block         = string
    zones              = list(string)
    edge_short_name    = string
    ami_id             = optional(string)
    single_nat_gateway = optional(bool, false)
    instance_types = list(object({
      name            = string
      gpu_type        = string
      gpu_count       = number
      gpu_memory_gb   = number
      vcpus           = optional(number)
      memory_gb       = optional(number)
      on_demand_price = number
      spot_price      = optional(number)
      zones           = optional(list(string))
    }))
  })
  description = "Control plane region: network, zones, edge load balancer name and the GPU instance types offered there (the first is the template default)."
}

variable "secondary" {
  type = object({
    region             = string
    cidr_block         = string
    zones              = list(string)
    edge_short_name    = string
    ami_id             = optional(string)
    single_nat_gateway = optional(bool, false)
    instance_types = list(object({
      name            = string
      gpu_type        = string
      gpu_count       = number
      gpu_memory_gb   = number
      vcpus           = optional(number)
      memory_gb       = optional(number)
      on_demand_price = number
      spot_price      = optional(number)
      zones           = optional(list(string))
    }))
  })
  description = "Second GPU and edge region, peered with the primary one."
}

variable "control_plane" {
  type = object({
    api_count         = optional(number, 2)
    worker_count      = optional(number, 2)
    db_instance_class = optional(string, "db.r6g.large")
    redis_node_type   = optional(string, "cache.r7g.large")
  })
  description = "Sizes of the control plane services and data stores."
  default     = {}
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the database and load balancers from deletion."
  default     = true
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource (on top of project=nimbus)."
  default     = {}
}
