data "aws_caller_identity" "current" {}

locals {
  tags    = merge({ project = "nimbus", nimbus-cluster = var.cluster_name }, var.tags)
  regions = [var.primary, var.secondary]
}

module "aws" {
  source    = "../../modules/aws/platform"
  providers = { aws = aws, aws.secondary = aws.secondary }

  name         = var.name
  cluster_name = var.cluster_name
  image        = var.image
  domain       = var.domain
  primary = {
    cidr_block            = var.primary.cidr_block
    zones                 = var.primary.zones
    default_instance_type = var.primary.instance_types[0].name
    ami_id                = var.primary.ami_id
    single_nat_gateway    = var.primary.single_nat_gateway
    edge_short_name       = var.primary.edge_short_name
  }
  secondary = {
    cidr_block            = var.secondary.cidr_block
    zones                 = var.secondary.zones
    default_instance_type = var.secondary.instance_types[0].name
    ami_id                = var.secondary.ami_id
    single_nat_gateway    = var.secondary.single_nat_gateway
    edge_short_name       = var.secondary.edge_short_name
  }
  control_plane       = var.control_plane
  deletion_protection = var.deletion_protection
}

module "catalog" {
  source = "../../modules/catalog"

  generated_by = "terraform/environments/aws"
  clouds = [
    {
      name    = "aws"
      project = data.aws_caller_identity.current.account_id
      regions = [
        for i, region in module.aws.catalog_regions :
        merge(region, { instance_types = local.regions[i].instance_types })
      ]
    },
  ]
}
