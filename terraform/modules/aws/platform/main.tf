data "aws_route53_zone" "public" {
  name         = var.domain
  private_zone = false
}

data "aws_caller_identity" "current" {}

data "aws_region" "secondary" {
  provider = aws.secondary
}

locals {
  api_domain_name = "api.${var.domain}"
  cp_domain_name  = "cp.${var.domain}"

  edge_secrets = module.control_plane.edge_secret_arns
  regions      = [module.primary, module.secondary]
}

module "kms_primary" {
  source = "../kms"

  name = var.name
  tags = var.tags
}

module "kms_secondary" {
  source    = "../kms"
  providers = { aws = aws.secondary }

  name = var.name
  tags = var.tags
}

module "primary" {
  source = "../region"

  name                     = var.name
  short_name               = var.primary.edge_short_name
  cluster_name             = var.cluster_name
  image                    = var.image
  kms_key_arn              = module.kms_primary.key_arn
  cidr_block               = var.primary.cidr_block
  zones                    = var.primary.zones
  single_nat_gateway       = var.primary.single_nat_gateway
  default_instance_type    = var.primary.default_instance_type
  ami_id                   = var.primary.ami_id
  zone_id                  = data.aws_route53_zone.public.zone_id
  global_domain_name       = local.api_domain_name
  control_plane_url        = module.control_plane.url
  redis_port               = module.control_plane.redis_port
  edge_secrets             = local.edge_secrets
  secrets_kms_key_arn      = module.kms_primary.key_arn
  peer_cidrs               = { secondary = var.secondary.cidr_block }
  redis_cidr               = var.primary.cidr_block
  remote_edge_cidrs        = var.remote_network.edge_cidrs
  remote_node_cidrs        = var.remote_network.node_cidrs
  admitted_security_groups = { control_plane = module.control_plane.services_security_group_id }
  deletion_protection      = var.deletion_protection
  tags                     = var.tags
}

module "secondary" {
  source    = "../region"
  providers = { aws = aws.secondary }

  name                  = var.name
  short_name            = var.secondary.edge_short_name
  cluster_name          = var.cluster_name
  image                 = var.image
  kms_key_arn           = module.kms_secondary.key_arn
  cidr_block            = var.secondary.cidr_block
  zones                 = var.secondary.zones
  single_nat_gateway    = var.secondary.single_nat_gateway
  default_instance_type = var.secondary.default_instance_type
  ami_id                = var.secondary.ami_id
  zone_id               = data.aws_route53_zone.public.zone_id
  global_domain_name    = local.api_domain_name
  control_plane_url     = module.control_plane.url
  redis_port            = module.control_plane.redis_port
  edge_secrets          = local.edge_secrets
  secrets_kms_key_arn   = module.kms_primary.key_arn
  peer_cidrs            = { primary = var.primary.cidr_block }
  redis_cidr            = var.primary.cidr_block
  deletion_protection   = var.deletion_protection
  tags                  = var.tags
}

module "peering" {
  source    = "../peering"
  providers = { aws = aws, aws.accepter = aws.secondary }

  name = "${var.name}-primary-secondary"
  requester = {
    vpc_id          = module.primary.network.vpc_id
    cidr_block      = module.primary.network.cidr_block
    route_table_ids = module.primary.network.private_route_table_ids
  }
  accepter = {
    region          = data.aws_region.secondary.name
    vpc_id          = module.secondary.network.vpc_id
    cidr_block      = module.secondary.network.cidr_block
    route_table_ids = module.secondary.network.private_route_table_ids
  }
  tags = var.tags
}

module "control_plane" {
  source = "../control-plane"

  name                     = var.name
  cluster_name             = var.cluster_name
  image                    = var.image
  vpc_id                   = module.primary.network.vpc_id
  vpc_cidr                 = module.primary.network.cidr_block
  peer_cidrs               = concat([var.secondary.cidr_block], var.remote_network.edge_cidrs)
  node_cidrs               = concat([var.primary.cidr_block, var.secondary.cidr_block], var.remote_network.node_cidrs)
  private_subnet_ids       = module.primary.network.private_subnet_ids
  public_subnet_ids        = module.primary.network.public_subnet_ids
  kms_key_arn              = module.kms_primary.key_arn
  log_bucket_id            = module.primary.log_bucket_id
  zone_id                  = data.aws_route53_zone.public.zone_id
  domain_name              = local.cp_domain_name
  api_count                = var.control_plane.api_count
  worker_count             = var.control_plane.worker_count
  batch_worker_count       = var.control_plane.batch_worker_count
  db_instance_class        = var.control_plane.db_instance_class
  redis_node_type          = var.control_plane.redis_node_type
  environment              = var.control_plane_environment
  gpu_launch_template_arns = [for r in local.regions : r.gpu.launch_template_arn]
  gpu_instance_role_arns   = [for r in local.regions : r.gpu.node_role_arn]
  gpu_vpc_arns             = [for r in local.regions : r.network.vpc_arn]
  gpu_kms_key_arns         = [module.kms_primary.key_arn, module.kms_secondary.key_arn]
  batch_bucket             = merge(module.primary.artifact_bucket, { kms_key_arn = module.kms_primary.key_arn })
  batch_edge_url           = module.primary.edge.url
  deletion_protection      = var.deletion_protection
  tags                     = var.tags
}

module "dns" {
  source = "../dns"

  zone_id     = data.aws_route53_zone.public.zone_id
  record_name = local.api_domain_name
  # The edge's region readiness (dataplane/edge/readiness.py): 503 when any model this region serves
  # has no healthy replica or the snapshot is stale, so DNS steers away at the model level. The
  # load balancer's target check stays on /health (liveness): tasks must not be replaced for a
  # model outage.
  health_check_path = "/health/ready"
  endpoints = merge(
    {
      for r in local.regions : r.region => {
        latency_region = r.region
        fqdn           = r.edge.fqdn
        alias          = { dns_name = r.edge.alb_dns_name, zone_id = r.edge.alb_zone_id }
      }
    },
    {
      for label, e in var.external_endpoints : label => {
        latency_region = e.latency_region
        fqdn           = e.fqdn
        ip_address     = e.ip_address
      }
    },
  )
  tags = var.tags
}
