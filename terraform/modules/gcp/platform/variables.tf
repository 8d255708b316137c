variable "project_id" {
  type        = string
  description = "GCP project Nimbus is deployed into."
}

variable "name" {
  type        = string
  description = "Name prefix for every resource, e.g. \"nimbus\" (2-16 lower-case characters)."
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster label on GPU nodes."
}

variable "image" {
  type        = string
  description = "Shared Nimbus container image for every role (Artifact Registry), pinned by tag or digest."
}

variable "domain" {
  type        = string
  description = "Domain Nimbus lives under, e.g. nimbus.example.com (cp.<domain>, api.<domain>, <region>.api.<domain>)."
}

variable "dns_managed_zone" {
  type        = string
  description = "Cloud DNS managed zone of the domain; null when DNS is managed elsewhere (Route 53 in multicloud)."
  default     = null
}

variable "regions" {
  type = map(object({
    nodes_cidr           = string
    services_cidr        = string
    default_machine_type = string
    accelerator = optional(object({
      type  = string
      count = number
    }))
  }))
  description = "GPU regions by name: subnet ranges, the machine type written into the template and, for N1 types, the GPUs to attach."
}

variable "private_services_cidr" {
  type        = string
  description = "Range reserved for Cloud SQL and Memorystore private addresses, e.g. 10.200.0.0/16."
  default     = "10.200.0.0/16"
}

variable "node_name_prefix" {
  type        = string
  description = "Prefix of the instance names the GCP provider gives GPU nodes (infra/gcp.py names them nimbus-<node id>); the provisioning role only touches instances and disks named so."
  default     = "nimbus-"
}

variable "control_plane" {
  type = object({
    region = string
    api_scaling = optional(object({
      min = number
      max = number
    }), { min = 2, max = 10 })
    worker_count       = optional(number, 2)
    batch_worker_count = optional(number, 1)
    database_tier      = optional(string, "db-custom-2-7680")
  })
  description = "Run the control plane in GCP (its region must be one of regions); null when it runs in another cloud."
  default     = null
}

variable "external_control_plane" {
  type = object({
    url = string
  })
  description = "Control plane running in another cloud that the edges talk to; used when control_plane is null."
  default     = null
}

variable "external_control_plane_aws_identity" {
  type = object({
    account_id = string
    role_arn   = string
  })
  description = "AWS account and task role of an external control plane, trusted through workload identity federation to provision GCP nodes; null when the control plane runs in GCP."
  default     = null
}

variable "external_edge_secrets" {
  type        = map(string)
  description = "Values of the edge secrets (NIMBUS_EDGE_TOKEN, NIMBUS_EDGE_REDIS_URL) issued by an external control plane; copied into Secret Manager."
  default     = {}
  sensitive   = true
}

variable "peer_cidrs" {
  type        = list(string)
  description = "CIDRs of another cloud connected over VPN (multicloud) whose edges and control plane may reach GCP GPU nodes."
  default     = []
}

variable "deletion_protection" {
  type        = bool
  description = "Protect databases and services from deletion."
  default     = true
}

variable "labels" {
  type        = map(string)
  description = "Labels added to every resource."
  default     = {}
}
