variable "name" {
  type        = string
  description = "Name prefix for the key alias, e.g. \"nimbus\"; the alias becomes alias/<name>-<region>."
}

variable "deletion_window_in_days" {
  type        = number
  description = "Days a scheduled key deletion waits before it happens (7-30)."
  default     = 30
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
