locals {
  labels = merge({ project = "nimbus", nimbus-cluster = var.cluster_name }, var.labels)
}

module "gcp" {
  source = "../../modules/gcp/platform"

  project_id       = var.project_id
  name             = var.name
  cluster_name     = var.cluster_name
  image            = var.image
  domain           = var.domain
  dns_managed_zone = var.dns_managed_zone
  regions = {
    for region, cfg in var.regions : region => {
      nodes_cidr           = cfg.nodes_cidr
      services_cidr        = cfg.services_cidr
      default_machine_type = cfg.instance_types[0].name
      accelerator          = cfg.accelerator
    }
  }
  private_services_cidr = var.private_services_cidr
  node_name_prefix      = var.control_plane.node_name_prefix
  control_plane = {
    region        = var.control_plane.region
    worker_count  = var.control_plane.worker_count
    database_tier = var.control_plane.database_tier
  }
  deletion_protection = var.deletion_protection
}

module "catalog" {
  source = "../../modules/catalog"

  generated_by = "terraform/environments/gcp"
  clouds = [
    {
      name    = "gcp"
      project = var.project_id
      regions = [
        for region, cfg in var.regions : merge(
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
