variable "project_id" {
  type        = string
  description = "GCP project of the service."
}

variable "name" {
  type        = string
  description = "Service name, e.g. nimbus-api or nimbus-edge-europe-west4."
}

variable "region" {
  type        = string
  description = "Region the service runs in."
}

variable "image" {
  type        = string
  description = "Shared Nimbus container image."
}

variable "args" {
  type        = list(string)
  description = "Arguments that select the role inside the shared image, e.g. [\"api\"] or [\"edge\"]."
}

variable "port" {
  type        = number
  description = "Port the container listens on."
}

variable "service_account_email" {
  type        = string
  description = "Identity the service runs as."
}

variable "environment" {
  type        = map(string)
  description = "Plain environment variables (never secrets)."
  default     = {}
}

variable "secrets" {
  type        = map(string)
  description = "Environment variables filled from Secret Manager at start: name => secret id (latest version)."
  default     = {}
}

variable "network" {
  type = object({
    network    = string
    subnetwork = string
    tags       = list(string)
  })
  description = "Direct VPC egress: network, subnetwork and the network tags the firewall keys on."
}

variable "scaling" {
  type = object({
    min = number
    max = number
  })
  description = "Minimum and maximum instances; min > 0 keeps the service warm."
  default     = { min = 1, max = 20 }
}

variable "resources" {
  type = object({
    cpu    = string
    memory = string
  })
  description = "CPU and memory limits of one instance, e.g. { cpu = \"2\", memory = \"2Gi\" }."
  default     = { cpu = "2", memory = "2Gi" }
}

variable "request_timeout" {
  type        = string
  description = "Longest a request (a token stream) may take, e.g. \"900s\"."
  default     = "900s"
}

variable "health_check_path" {
  type        = string
  description = "HTTP path that answers 200 once the service is ready."
  default     = "/healthz"
}

variable "deletion_protection" {
  type        = bool
  description = "Refuse to delete the service until this is turned off."
  default     = true
}

variable "labels" {
  type        = map(string)
  description = "Labels added to the service."
  default     = {}
}
