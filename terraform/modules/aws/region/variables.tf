variable "name" {
  type        = string
  description = "Name prefix for every resource, e.g. \"nimbus\"."
}

variable "short_name" {
  type        = string
  description = "Short unique name of this region's edge load balancer (at most 20 characters), e.g. nimbus-edge-use1."
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster tag on GPU nodes of this deployment."
}

variable "image" {
  type        = string
  description = "Shared Nimbus container image (the edge runs it here; GPU nodes pull it)."
}

variable "kms_key_arn" {
  type        = string
  description = "ARN of this region's KMS key."
}

variable "cidr_block" {
  type        = string
  description = "IPv4 CIDR of this region's VPC (distinct from every other region's)."
}

variable "zones" {
  type        = list(string)
  description = "Availability zones GPU nodes may be launched in (two or more)."
}

variable "single_nat_gateway" {
  type        = bool
  description = "One NAT gateway for the region instead of one per zone."
  default     = false
}

variable "default_instance_type" {
  type        = string
  description = "Instance type written into the GPU launch template (overridden per launch)."
}

variable "ami_id" {
  type        = string
  description = "GPU image; null picks the region's latest AWS Deep Learning Base AMI."
  default     = null
}

variable "zone_id" {
  type        = string
  description = "Route 53 hosted zone for the edge's names."
}

variable "global_domain_name" {
  type        = string
  description = "Latency-routed API name, e.g. api.nimbus.example.com; the regional edge becomes <region>.<global_domain_name>."
}

variable "control_plane_url" {
  type        = string
  description = "HTTPS URL of the control plane."
}

variable "redis_port" {
  type        = number
  description = "Port of the control plane's Redis (reached over VPC peering from other regions)."
  default     = 6379
}

variable "edge_secrets" {
  type        = map(string)
  description = "Environment variables of the edge filled from Secrets Manager (NIMBUS_EDGE_TOKEN, NIMBUS_EDGE_REDIS_URL): name => secret ARN."
}

variable "secrets_kms_key_arn" {
  type        = string
  description = "ARN of the KMS key that encrypts the edge secrets."
}

variable "peer_cidrs" {
  type        = map(string)
  description = "CIDRs of the other regions' VPCs by label; their edges and control plane reach this region's nodes."
  default     = {}
}

variable "redis_cidr" {
  type        = string
  description = "CIDR of the control plane's VPC, where Redis lives."
}

variable "remote_edge_cidrs" {
  type        = list(string)
  description = "CIDRs of edges in another cloud, reached over VPN (multicloud); they may reach this region's GPU nodes."
  default     = []
}

variable "remote_node_cidrs" {
  type        = list(string)
  description = "CIDRs of GPU nodes in another cloud, reached over VPN (multicloud); this region's edge may connect to them."
  default     = []
}

variable "admitted_security_groups" {
  type        = map(string)
  description = "Security groups in this VPC besides the edge's that reach the GPU nodes (the control plane in its region)."
  default     = {}
}

variable "edge_count" {
  type        = number
  description = "Number of edge tasks in this region."
  default     = 2
}

variable "deletion_protection" {
  type        = bool
  description = "Protect load balancers from deletion."
  default     = true
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
