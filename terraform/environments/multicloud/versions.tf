terraform {
  required_version = ">= 1.6"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
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

provider "aws" {
  region = var.aws_primary.region

  default_tags {
    tags = local.tags
  }
}

provider "aws" {
  alias  = "secondary"
  region = var.aws_secondary.region

  default_tags {
    tags = local.tags
  }
}

provider "google" {
  project        = var.gcp_project_id
  default_labels = local.tags
}

provider "google-beta" {
  project        = var.gcp_project_id
  default_labels = local.tags
}
