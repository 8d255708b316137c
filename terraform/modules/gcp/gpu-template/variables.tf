variable "project_id" {
  type        = string
  description = "GCP project GPU nodes run in."
}

variable "name" {
  type        = string
  description = "Name prefix; the template becomes <name>-gpu-<region>-<suffix>."
}

variable "region" {
  type        = string
  description = "Region of the template and of the nodes launched from it."
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster label on every node launched from the template."
}

variable "default_machine_type" {
  type        = string
  description = "Machine type written into the template; the control plane overrides it per launch from the catalog."
}

variable "accelerator" {
  type = object({
    type  = string
    count = number
  })
  description = "GPUs to attach for N1 machine types (e.g. nvidia-tesla-t4); null for A2/A3/G2 types, whose GPUs come with the machine type."
  default     = null
}

variable "boot_image" {
  type        = string
  description = "Boot image with NVIDIA drivers, e.g. a Deep Learning VM image family."
  default     = "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-py310"
}

variable "secure_boot" {
  type        = bool
  description = "Shielded VM Secure Boot; only for boot images whose NVIDIA kernel modules are signed (driver images built with DKMS are not). vTPM and integrity monitoring stay on either way."
  default     = false
}

variable "boot_disk_size_gb" {
  type        = number
  description = "Size of the encrypted boot disk in GB; it also caches model weights."
  default     = 500
}

variable "kms_key_id" {
  type        = string
  description = "Id of the regional KMS key that encrypts the boot disk."
}

variable "subnetwork" {
  type        = string
  description = "Self link of the GPU node subnetwork of this region."
}

variable "network_tag" {
  type        = string
  description = "Network tag that opens the engine and agent ports to edges and the control plane."
}

variable "artifact_bucket" {
  type        = string
  description = "Name of the regional artifact bucket nodes read model weights from."
}

variable "labels" {
  type        = map(string)
  description = "Labels added to every resource."
  default     = {}
}
