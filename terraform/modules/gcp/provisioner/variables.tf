variable "project_id" {
  type        = string
  description = "GCP project GPU nodes are launched in."
}

variable "name" {
  type        = string
  description = "Name prefix of the service account and custom role."
}

variable "node_name_prefix" {
  type        = string
  description = "Prefix of the instance names the GCP provider gives GPU nodes; the role only touches instances and disks named so (GCP IAM conditions cannot test labels)."
}

variable "gpu_service_account_ids" {
  type        = map(string)
  description = "GPU node service accounts by region (fully qualified ids); the provisioner may launch instances as them."
}

variable "aws_workload_identity" {
  type = object({
    account_id = string
    role_arn   = string
  })
  description = "Control plane running in AWS (multicloud): its account and task role, which may impersonate the provisioner through workload identity federation; null when it runs in GCP."
  default     = null
}
