# One control plane (AWS) provisions GPU nodes in both clouds; every region of both
# clouds runs an edge, and one latency-routed name (Route 53) spreads tenants over all
# of them. An HA VPN joins the control plane's AWS VPC and the GCP VPC, so GCP edges
# reach the control plane's Redis and replicas in both clouds.

data "aws_route53_zone" "public" {
  name         = var.domain
  private_zone = false
}

locals {
  tags        = merge({ project = "nimbus", nimbus-cluster = var.cluster_name }, var.tags)
  aws_regions = [var.aws_primary, var.aws_secondary]
}

module "aws" {
  source    = "../../modules/aws/platform"
  providers = { aws = aws, aws.secondary = aws.secondary }

  name         = var.name
  cluster_name = var.cluster_name
  image        = var.image
  domain       = var.domain
  primary = {
    cidr_block            = var.aws_primary.cidr_block
    zones                 = var.aws_primary.zones
    default_instance_type = var.aws_primary.instance_types[0].name
    ami_id                = var.aws_primary.ami_id
    single_nat_gateway    = var.aws_primary.single_nat_gateway
    edge_short_name       = var.aws_primary.edge_short_name
  }
  secondary = {
    cidr_block            = var.aws_secondary.cidr_block
    zones                 = var.aws_secondary.zones
    default_instance_type = var.aws_secondary.instance_types[0].name
    ami_id                = var.aws_secondary.ami_id
    single_nat_gateway    = var.aws_secondary.single_nat_gateway
    edge_short_name       = var.aws_secondary.edge_short_name
  }
  # GCP edges and nodes are reached over the HA VPN from the primary region.
  remote_network = {
    edge_cidrs = [for cfg in values(var.gcp_regions) : cfg.services_cidr]
    node_cidrs = [for cfg in values(var.gcp_regions) : cfg.nodes_cidr]
  }
  external_endpoints = {
    for region, cfg in var.gcp_regions : "gcp-${region}" => {
      latency_region = cfg.latency_region
      fqdn           = module.gcp.edge_domain_names[region]
      ip_address     = module.gcp.load_balancer_ip
    }
  }
  # The control plane calls Compute Engine as the GCP provisioner service account,
  # exchanging its AWS role credentials through workload identity federation.
  control_plane_environment = {
    NIMBUS_GCP_PROJECT                    = var.gcp_project_id
    NIMBUS_GCP_WORKLOAD_IDENTITY_PROVIDER = module.gcp.workload_identity_provider
    NIMBUS_GCP_SERVICE_ACCOUNT            = module.gcp.provisioner_service_account
  }
  deletion_protection = var.deletion_protection
}

module "gcp" {
  source = "../../modules/gcp/platform"

  project_id   = var.gcp_project_id
  name         = var.name
  cluster_name = var.cluster_name
  image        = var.gcp_image
  domain       = var.domain
  regions = {
    for region, cfg in var.gcp_regions : region => {
      nodes_cidr           = cfg.nodes_cidr
      services_cidr        = cfg.services_cidr
      default_machine_type = cfg.instance_types[0].name
      accelerator          = cfg.accelerator
    }
  }
  external_control_plane = {
    url = module.aws.control_plane_url
  }
  external_control_plane_aws_identity = {
    account_id = module.aws.account_id
    role_arn   = module.aws.control_plane_role_arn
  }
  external_edge_secrets = module.aws.edge_secret_values
  # Only the primary AWS VPC is on the VPN (VPC peering does not carry it further).
  peer_cidrs          = [var.aws_primary.cidr_block]
  deletion_protection = var.deletion_protection
}

module "vpn" {
  source = "../../modules/multicloud/vpn"

  name = var.name
  aws = {
    vpc_id          = module.aws.primary_network.vpc_id
    route_table_ids = module.aws.primary_network.private_route_table_ids
  }
  gcp = {
    project_id = var.gcp_project_id
    region     = var.gcp_vpn_region
    network_id = module.gcp.network_id
  }
  kms_key_arn = module.aws.primary_kms_key_arn
  tags        = local.tags
}

# The GCP edges' own names live in the Route 53 zone and point at the anycast
# address of the GCP load balancer, which routes each name to its region.
resource "aws_route53_record" "gcp_edges" {
  #checkov:skip=CKV2_AWS_23:The address is the global IP of the GCP load balancer, which Route 53 cannot reference as a resource.
  for_each = var.gcp_regions

  zone_id = data.aws_route53_zone.public.zone_id
  name    = "${each.key}.api.${var.domain}"
  type    = "A"
  ttl     = 300
  records = [module.gcp.load_balancer_ip]
}

module "catalog" {
  source = "../../modules/catalog"

  generated_by = "terraform/environments/multicloud"
  clouds = [
    {
      name    = "aws"
      project = module.aws.account_id
      regions = [
        for i, region in module.aws.catalog_regions :
        merge(region, { instance_types = local.aws_regions[i].instance_types })
      ]
    },
    {
      name    = "gcp"
      project = var.gcp_project_id
      regions = [
        for region, cfg in var.gcp_regions : merge(
          module.gcp.catalog_regions[region],
          {
            zones          = [for zone in cfg.zones : { name = zone, subnet = module.gcp.catalog_regions[region].subnet }]
            instance_types = cfg.instance_types
          },
        )
      ]
    },
  ]
}
