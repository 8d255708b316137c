variable "name" {
  type        = string
  description = "Bucket name prefix; the bucket becomes <name>-artifacts-<region>-<account id>."
}

variable "kms_key_arn" {
  type        = string
  description = "ARN of the regional KMS key that encrypts model weights at rest."
}

variable "log_bucket_id" {
  type        = string
  description = "Name of the regional log bucket that receives S3 server access logs."
}

variable "log_prefix" {
  type        = string
  description = "Key prefix in the log bucket for S3 server access logs."
  default     = "s3"
}

variable "noncurrent_version_days" {
  type        = number
  description = "Days a replaced model artifact version is kept before it is deleted."
  default     = 14
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
