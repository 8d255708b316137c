variable "project_id" {
  type        = string
  description = "GCP project of the edge."
}

variable "name" {
  type        = string
  description = "Name prefix; the edge becomes <name>-edge-<region>."
}

variable "region" {
  type        = string
  description = "Region this edge serves."
}

variable "image" {
  type        = string
  description = "Shared Nimbus container image (run with the edge argument)."
}

variable "port" {
  type        = number
  description = "Port the edge container listens on."
  default     = 8080
}

variable "domain_name" {
  type        = string
  description = "Regional name of this edge, e.g. europe-west4.api.nimbus.example.com."
}

variable "network" {
  type = object({
    network    = string
    subnetwork = string
    tags       = list(string)
  })
  description = "Direct VPC egress of the edge: network, the region's services subnetwork and the edge network tag."
}

variable "control_plane_url" {
  type        = string
  description = "HTTPS URL of the control plane; the edge pulls routing snapshots from it."
}

variable "redis_ca_pem" {
  type        = string
  description = "CA certificate of a Redis with a private CA (Memorystore); null when Redis presents a publicly trusted certificate."
  default     = null
}

variable "secrets" {
  type        = map(string)
  description = "Environment variables filled from Secret Manager (NIMBUS_EDGE_TOKEN, NIMBUS_EDGE_REDIS_URL): name => secret id."
}

variable "scaling" {
  type = object({
    min = number
    max = number
  })
  description = "Minimum and maximum edge instances."
  default     = { min = 2, max = 50 }
}

variable "deletion_protection" {
  type        = bool
  description = "Refuse to delete the service until this is turned off."
  default     = true
}

variable "labels" {
  type        = map(string)
  description = "Labels added to every resource."
  default     = {}
}
