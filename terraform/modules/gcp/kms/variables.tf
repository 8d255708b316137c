variable "project_id" {
  type        = string
  description = "GCP project the keys live in."
}

variable "name" {
  type        = string
  description = "Name prefix of the key rings and keys."
}

variable "regions" {
  type        = list(string)
  description = "Regions that get a key ring and a key (CMEK must be in the same location as the data it protects)."
}

variable "rotation_period" {
  type        = string
  description = "How often keys rotate, in seconds with an s suffix (at most 90 days)."
  default     = "7776000s"
}

variable "labels" {
  type        = map(string)
  description = "Labels added to every key."
  default     = {}
}
