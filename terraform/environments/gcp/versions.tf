terraform {
  required_version = ">= 1.6"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = "~> 6.41"
    }
    google-beta = {
      source  = "hashicorp/google-beta"
      version = "~> 6.41"
    }
    random = {
      source  = "hashicorp/random"
      version = "~> 3.6"
    }
  }
}

provider "google" {
  project        = var.project_id
  default_labels = local.labels
}

provider "google-beta" {
  project        = var.project_id
  default_labels = local.labels
}
