variable "name" {
  type        = string
  description = "Name prefix for every resource, e.g. \"nimbus\" (2-16 lower-case characters)."
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster tag on GPU nodes; the control plane's permissions are scoped to it."
}

variable "image" {
  type        = string
  description = "Shared Nimbus container image for every role, pinned by tag or digest."
}

variable "domain" {
  type        = string
  description = "Public Route 53 hosted zone Nimbus lives under, e.g. nimbus.example.com (cp.<domain>, api.<domain>, <region>.api.<domain>)."
}

variable "primary" {
  type = object({
    cidr_block            = string
    zones                 = list(string)
    default_instance_type = string
    ami_id                = optional(string)
    single_nat_gateway    = optional(bool, false)
    edge_short_name       = string
  })
  description = "Region of the default aws provider: control plane, an edge and GPU nodes."
}

variable "secondary" {
  type = object({
    cidr_block            = string
    zones                 = list(string)
    default_instance_type = string
    ami_id                = optional(string)
    single_nat_gateway    = optional(bool, false)
    edge_short_name       = string
  })
  description = "Region of the aws.secondary provider: an edge and GPU nodes, peered with the primary region."
}

variable "control_plane" {
  type = object({
    api_count          = optional(number, 2)
    worker_count       = optional(number, 2)
    batch_worker_count = optional(number, 1)
    db_instance_class  = optional(string, "db.r6g.large")
    redis_node_type    = optional(string, "cache.r7g.large")
  })
  description = "Sizes of the control plane services and data stores."
  default     = {}
}

variable "control_plane_environment" {
  type        = map(string)
  description = "Extra plain environment variables for the control plane services, e.g. how to reach another cloud (never secrets)."
  default     = {}
}

variable "external_endpoints" {
  type = map(object({
    latency_region = string
    fqdn           = string
    ip_address     = string
  }))
  description = "Edges outside AWS (GCP in multicloud) that join the latency-routed API name, by label."
  default     = {}
}

variable "remote_network" {
  type = object({
    edge_cidrs = list(string)
    node_cidrs = list(string)
  })
  description = "Networks of another cloud connected to the primary region over VPN (multicloud): where its edges and its GPU nodes live."
  default     = { edge_cidrs = [], node_cidrs = [] }
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the database and load balancers from deletion."
  default     = true
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
