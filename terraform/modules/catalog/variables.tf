# The types below mirror infra/catalog/schema.json, the contract with
# `nimbus catalog import`; tests/terraform checks that they stay in step.

variable "generated_by" {
  type        = string
  description = "Who produced the catalog, e.g. \"terraform/environments/aws\"."
}

variable "clouds" {
  type = list(object({
    name    = string
    project = optional(string)
    regions = list(object({
      name            = string
      edge_url        = optional(string)
      artifact_bucket = optional(string)
      template = object({
        kind    = string
        id      = string
        name    = optional(string)
        version = optional(string)
      })
      zones = list(object({
        name   = string
        subnet = optional(string)
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
  }))
  description = "Clouds with their regions, zones, subnets, node templates and instance types (GPU type, count, memory, prices)."

  validation {
    condition     = alltrue([for c in var.clouds : contains(["aws", "gcp", "local"], c.name)])
    error_message = "Cloud names are aws, gcp or local."
  }
}
