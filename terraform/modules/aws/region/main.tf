data "aws_region" "current" {}

locals {
  region = data.aws_region.current.name
}

# Everything one region of a deployment needs besides the control plane: its VPC,
# log sink, weights bucket, GPU launch template and edge.

module "network" {
  source = "../network"

  name               = "${var.name}-${local.region}"
  cidr_block         = var.cidr_block
  zones              = var.zones
  single_nat_gateway = var.single_nat_gateway
  kms_key_arn        = var.kms_key_arn
  tags               = var.tags
}

module "logs" {
  source = "../log-bucket"

  name = var.name
  tags = var.tags
}

module "artifacts" {
  source = "../artifact-bucket"

  name          = var.name
  kms_key_arn   = var.kms_key_arn
  log_bucket_id = module.logs.bucket_id
  log_prefix    = module.logs.s3_prefix
  tags          = var.tags
}

module "edge" {
  source = "../edge"

  name                = var.name
  short_name          = var.short_name
  image               = var.image
  domain_name         = "${local.region}.${var.global_domain_name}"
  global_domain_name  = var.global_domain_name
  zone_id             = var.zone_id
  vpc_id              = module.network.vpc_id
  vpc_cidr            = module.network.cidr_block
  public_subnet_ids   = module.network.public_subnet_ids
  private_subnet_ids  = module.network.private_subnet_ids
  desired_count       = var.edge_count
  control_plane_url   = var.control_plane_url
  redis_port          = var.redis_port
  redis_cidr          = var.redis_cidr
  secrets             = var.edge_secrets
  secrets_kms_key_arn = var.secrets_kms_key_arn
  node_cidrs          = concat([var.cidr_block], values(var.peer_cidrs), var.remote_node_cidrs)
  kms_key_arn         = var.kms_key_arn
  log_bucket_id       = module.logs.bucket_id
  deletion_protection = var.deletion_protection
  tags                = var.tags
}

module "gpu_template" {
  source = "../gpu-template"

  name                     = var.name
  cluster_name             = var.cluster_name
  vpc_id                   = module.network.vpc_id
  default_instance_type    = var.default_instance_type
  ami_id                   = var.ami_id
  kms_key_arn              = var.kms_key_arn
  artifact_bucket_arn      = module.artifacts.bucket_arn
  admitted_security_groups = merge(var.admitted_security_groups, { edge = module.edge.security_group_id })
  admitted_cidrs           = merge(var.peer_cidrs, { for i, cidr in var.remote_edge_cidrs : "remote-${i}" => cidr })
  tags                     = var.tags
}
