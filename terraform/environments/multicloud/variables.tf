variable "name" {
  type        = string
  description = "Name prefix for every resource in both clouds (2-16 lower-case characters)."
  default     = "nimbus"
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster tag and label on GPU nodes in both clouds."
}

variable "image" {
  type        = string
  description = "Shared Nimbus container image for the AWS side (e.g. an ECR repository URI)."
}

variable "gcp_image" {
  type        = string
  description = "The same image mirrored into Artifact Registry for the GCP side (Cloud Run pulls only from Google registries)."
}

variable "domain" {
  type        = string
  description = "Public Route 53 hosted zone Nimbus lives under; GCP edges get their names there too."
}

variable "aws_primary" {
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
  description = "AWS region of the control plane, with an edge and GPU nodes."
}

variable "aws_secondary" {
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
  description = "Second AWS region with an edge and GPU nodes."
}

variable "gcp_project_id" {
  type        = string
  description = "GCP project of the GCP regions."
}

variable "gcp_regions" {
  type = map(object({
    nodes_cidr     = string
    services_cidr  = string
    zones          = list(string)
    latency_region = string
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
  description = "GCP regions with an edge and GPU nodes; latency_region is the nearest AWS region, against which Route 53 measures latency for the GCP edge."
}

variable "gcp_vpn_region" {
  type        = string
  description = "GCP region of the HA VPN gateway to the control plane's AWS VPC (one of gcp_regions, ideally the closest to the AWS primary region)."
}

variable "deletion_protection" {
  type        = bool
  description = "Protect databases, services and load balancers from deletion."
  default     = true
}

variable "tags" {
  type        = map(string)
  description = "Tags and labels added to every resource in both clouds (on top of project=nimbus)."
  default     = {}
}
