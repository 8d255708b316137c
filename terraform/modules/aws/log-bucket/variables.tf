variable "name" {
  type        = string
  description = "Bucket name prefix; the bucket becomes <name>-logs-<region>-<account id>."
}

variable "retention_days" {
  type        = number
  description = "Days access logs are kept before they expire."
  default     = 400
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
