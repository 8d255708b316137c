variable "zone_id" {
  type        = string
  description = "Route 53 hosted zone of the public API name."
}

variable "record_name" {
  type        = string
  description = "Public API name tenants call, e.g. api.nimbus.example.com."
}

variable "endpoints" {
  type = map(object({
    latency_region = string
    fqdn           = string
    alias = optional(object({
      dns_name = string
      zone_id  = string
    }))
    ip_address = optional(string)
  }))
  description = <<-EOT
    Regional edges by name. latency_region is the AWS region Route 53 measures latency
    against (for a GCP edge, the nearest AWS region); fqdn is the edge's own name that the
    health check probes; the record points at an AWS alias (load balancer) or, for an edge
    outside AWS, an IPv4 address.
  EOT

  validation {
    condition     = alltrue([for e in values(var.endpoints) : (e.alias == null) != (e.ip_address == null)])
    error_message = "Each endpoint needs exactly one of alias or ip_address."
  }
}

variable "health_check_path" {
  type        = string
  description = "Path probed on each edge; a region that fails it leaves the latency rotation. The edge's /health/ready fails when any model it should serve has no healthy replica or its snapshot is stale."
  default     = "/health/ready"
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
