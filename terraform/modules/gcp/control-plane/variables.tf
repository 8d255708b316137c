variable "project_id" {
  type        = string
  description = "GCP project of the control plane."
}

variable "name" {
  type        = string
  description = "Name prefix for every resource (2-16 lower-case characters)."

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,15}$", var.name))
    error_message = "Use 2-16 lower-case letters, digits or dashes, starting with a letter."
  }
}

variable "region" {
  type        = string
  description = "Region of the control plane, Cloud SQL and Memorystore."
}

variable "cluster_name" {
  type        = string
  description = "Value of the nimbus-cluster label on every node this control plane launches."
}

variable "service_account_email" {
  type        = string
  description = "Identity the control plane runs as (the provisioner service account, which holds the Compute permissions)."
}

variable "image" {
  type        = string
  description = "Shared Nimbus container image for the API, worker and beat."
}

variable "domain_name" {
  type        = string
  description = "Fully qualified name of the control plane API and console, e.g. cp.nimbus.example.com."
}

variable "network" {
  type = object({
    network_id  = string
    subnetwork  = string
    network_tag = string
  })
  description = "VPC of the control plane: network id (taken from the private services connection, so Cloud SQL and Memorystore wait for it), the region's services subnetwork and the control plane network tag."
}

variable "artifact_bucket" {
  type        = string
  description = "Name of the artifact bucket in the control plane's region; the Batch API keeps its files under its batches/ prefix."
}

variable "kms_key_id" {
  type        = string
  description = "Id of the regional KMS key that encrypts Cloud SQL, Memorystore and the secrets."
}

variable "api_port" {
  type        = number
  description = "Port the API container listens on."
  default     = 8000
}

variable "api_scaling" {
  type = object({
    min = number
    max = number
  })
  description = "Minimum and maximum API instances."
  default     = { min = 2, max = 10 }
}

variable "worker_count" {
  type        = number
  description = "Number of Celery worker instances."
  default     = 2
}

variable "batch_worker_count" {
  type        = number
  description = "Number of Celery batch worker instances (the batches queue; each runs NIMBUS_BATCH_WORKER_CONCURRENCY batches at once, 2 unless set)."
  default     = 1
}

variable "batch_edge_url" {
  type        = string
  description = "Edge the batch workers send Batch API lines through (NIMBUS_BATCH_EDGE_URL), e.g. the control plane region's edge https://us-central1.api.nimbus.example.com."
}

variable "database_tier" {
  type        = string
  description = "Cloud SQL machine tier."
  default     = "db-custom-2-7680"
}

variable "database_version" {
  type        = string
  description = "Cloud SQL Postgres version."
  default     = "POSTGRES_16"
}

variable "redis_memory_size_gb" {
  type        = number
  description = "Memorystore capacity in GB."
  default     = 5
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the database and services from deletion."
  default     = true
}

variable "labels" {
  type        = map(string)
  description = "Labels added to every resource."
  default     = {}
}
