variable "project_id" {
  type        = string
  description = "GCP project Nimbus is deployed into."
}

variable "name" {
  type        = string
  description = "Name prefix for every resource (2-16 lower-case characters)."
  default     = "nimbus"
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster label on GPU nodes; one per deployment."
}

variable "image" {
  type        = string
  description = "Shared Nimbus container image in Artifact Registry, pinned by tag or digest."
}

variable "domain" {
  type        = string
  description = "Domain Nimbus lives under, e.g. nimbus.example.com."
}

variable "dns_managed_zone" {
  type        = string
  description = "Cloud DNS managed zone that serves the domain."
}

variable "control_plane" {
  type = object({
    region           = string
    node_name_prefix = optional(string, "nimbus-")
    worker_count     = optional(number, 2)
    database_tier    = optional(string, "db-custom-2-7680")
  })
  description = "Where the control plane runs (one of the regions) and its sizes."
}

variable "private_services_cidr" {
  type        = string
  description = "Range reserved for Cloud SQL and Memorystore private addresses."
  default     = "10.200.0.0/16"
}

variable "regions" {
  type = map(object({
    nodes_cidr    = string
    services_cidr = string
    zones         = list(string)
    accelerator = optional(object({
      type  = string
      count = number
    }))
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
  }))
  description = "GPU and edge regions by name: subnet ranges, zones and the machine types offered there (the first is the template default)."
}

variable "deletion_protection" {
  type        = bool
  description = "Protect databases and services from deletion."
  default     = true
}

variable "labels" {
  type        = map(string)
  description = "Labels added to every resource (on top of project=nimbus)."
  default     = {}
}
