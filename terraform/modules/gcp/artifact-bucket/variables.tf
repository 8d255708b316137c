variable "project_id" {
  type        = string
  description = "GCP project of the bucket."
}

variable "name" {
  type        = string
  description = "Name prefix; the bucket becomes <project>-<name>-artifacts-<region>."
}

variable "region" {
  type        = string
  description = "Region the bucket lives in, next to the GPU nodes that read it."
}

variable "kms_key_id" {
  type        = string
  description = "Id of the regional KMS key that encrypts the objects."
}

variable "noncurrent_version_days" {
  type        = number
  description = "Days a replaced model artifact version is kept."
  default     = 14
}

variable "labels" {
  type        = map(string)
  description = "Labels added to the buckets."
  default     = {}
}
