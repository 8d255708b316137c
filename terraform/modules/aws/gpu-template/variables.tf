variable "name" {
  type        = string
  description = "Name prefix; the template becomes <name>-gpu-<region>."
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster tag stamped on every node launched from the template."
}

variable "vpc_id" {
  type        = string
  description = "VPC GPU nodes are launched into (subnets are chosen per launch by the control plane)."
}

variable "default_instance_type" {
  type        = string
  description = "Instance type written into the template; the control plane overrides it per launch from the catalog."
}

variable "ami_id" {
  type        = string
  description = "GPU image for the nodes; null picks the latest AWS Deep Learning Base AMI (NVIDIA driver, Ubuntu 22.04) of the region."
  default     = null
}

variable "root_volume_size_gb" {
  type        = number
  description = "Size of the encrypted root volume in GiB; it also caches model weights."
  default     = 500
}

variable "kms_key_arn" {
  type        = string
  description = "ARN of the regional KMS key that encrypts the node volumes."
}

variable "artifact_bucket_arn" {
  type        = string
  description = "ARN of the regional artifact bucket nodes read model weights from."
}

variable "engine_ports" {
  type = object({
    from = number
    to   = number
  })
  description = "Port range of the engines on a node (one port per replica); only edges reach them."
  default     = { from = 30000, to = 30015 }
}

variable "agent_port" {
  type        = number
  description = "Port of the node agent (drain and status); only the control plane and edges reach it."
  default     = 8479
}

variable "admitted_security_groups" {
  type        = map(string)
  description = "Security groups in this VPC that may reach the engines and the agent, by role: { edge = sg-…, control_plane = sg-… }."
}

variable "admitted_cidrs" {
  type        = map(string)
  description = "CIDRs outside this VPC (edges and control plane of peered regions) that may reach the engines and the agent, by label."
  default     = {}
}

variable "image_repository_arns" {
  type        = list(string)
  description = "ECR repositories the node may pull the Nimbus image from (empty when the image lives elsewhere)."
  default     = []
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
