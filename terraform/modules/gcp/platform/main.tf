locals {
  api_domain_name = "api.${var.domain}"
  cp_domain_name  = "cp.${var.domain}"
  regions         = toset(keys(var.regions))
  has_cp          = var.control_plane != null
}

# The APIs every part below calls; left enabled on destroy because other workloads in
# the project may use them too.
resource "google_project_service" "this" {
  for_each = toset([
    "cloudkms.googleapis.com",
    "compute.googleapis.com",
    "dns.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "redis.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "servicenetworking.googleapis.com",
    "sqladmin.googleapis.com",
    "sts.googleapis.com",
  ])

  project            = var.project_id
  service            = each.key
  disable_on_destroy = false
}

module "kms" {
  source     = "../kms"
  depends_on = [google_project_service.this]

  project_id = var.project_id
  name       = var.name
  regions    = keys(var.regions)
  labels     = var.labels
}

module "network" {
  source     = "../network"
  depends_on = [google_project_service.this]

  project_id            = var.project_id
  name                  = var.name
  regions               = { for r, cfg in var.regions : r => { nodes_cidr = cfg.nodes_cidr, services_cidr = cfg.services_cidr } }
  private_services_cidr = var.private_services_cidr
  peer_cidrs            = var.peer_cidrs
}

module "artifacts" {
  source   = "../artifact-bucket"
  for_each = local.regions

  project_id = var.project_id
  name       = var.name
  region     = each.key
  kms_key_id = module.kms.key_ids[each.key]
  labels     = var.labels
}

module "gpu_template" {
  source   = "../gpu-template"
  for_each = var.regions

  project_id           = var.project_id
  name                 = var.name
  region               = each.key
  cluster_name         = var.cluster_name
  default_machine_type = each.value.default_machine_type
  accelerator          = each.value.accelerator
  kms_key_id           = module.kms.key_ids[each.key]
  subnetwork           = module.network.node_subnets[each.key]
  network_tag          = module.network.network_tags.gpu
  artifact_bucket      = module.artifacts[each.key].name
  labels               = var.labels
}

module "provisioner" {
  source     = "../provisioner"
  depends_on = [google_project_service.this]

  project_id              = var.project_id
  name                    = var.name
  node_name_prefix        = var.node_name_prefix
  gpu_service_account_ids = { for r, t in module.gpu_template : r => t.service_account_id }
  aws_workload_identity   = var.external_control_plane_aws_identity
}

module "control_plane" {
  source = "../control-plane"
  count  = local.has_cp ? 1 : 0

  project_id            = var.project_id
  name                  = var.name
  region                = var.control_plane.region
  cluster_name          = var.cluster_name
  service_account_email = module.provisioner.service_account_email
  image                 = var.image
  domain_name           = local.cp_domain_name
  network = {
    network_id  = module.network.private_services_network_id
    subnetwork  = module.network.service_subnets[var.control_plane.region]
    network_tag = module.network.network_tags.control_plane
  }
  kms_key_id          = module.kms.key_ids[var.control_plane.region]
  artifact_bucket     = module.artifacts[var.control_plane.region].name
  api_scaling         = var.control_plane.api_scaling
  worker_count        = var.control_plane.worker_count
  batch_worker_count  = var.control_plane.batch_worker_count
  batch_edge_url      = module.edge[var.control_plane.region].url
  database_tier       = var.control_plane.database_tier
  deletion_protection = var.deletion_protection
  labels              = var.labels
}

# With the control plane elsewhere, the edge secrets it issued are copied into
# Secret Manager next to the edges.
resource "google_secret_manager_secret" "external" {
  for_each = local.has_cp ? toset([]) : toset(nonsensitive(keys(var.external_edge_secrets)))

  project   = var.project_id
  secret_id = "${var.name}-${lower(replace(each.key, "_", "-"))}"
  labels    = var.labels

  replication {
    user_managed {
      dynamic "replicas" {
        for_each = local.regions
        content {
          location = replicas.key
          customer_managed_encryption {
            kms_key_name = module.kms.key_ids[replicas.key]
          }
        }
      }
    }
  }
}

resource "google_secret_manager_secret_version" "external" {
  for_each = google_secret_manager_secret.external

  secret      = each.value.id
  secret_data = var.external_edge_secrets[each.key]
}

locals {
  control_plane_url = local.has_cp ? module.control_plane[0].url : var.external_control_plane.url
  redis_ca_pem      = local.has_cp ? module.control_plane[0].redis_ca_certificate : null
  edge_secrets = local.has_cp ? module.control_plane[0].edge_secret_ids : {
    for key, secret in google_secret_manager_secret.external : key => secret.secret_id
  }
}

module "edge" {
  source   = "../edge"
  for_each = local.regions

  project_id  = var.project_id
  name        = var.name
  region      = each.key
  image       = var.image
  domain_name = "${each.key}.${local.api_domain_name}"
  network = {
    network    = module.network.network_id
    subnetwork = module.network.service_subnets[each.key]
    tags       = [module.network.network_tags.edge]
  }
  control_plane_url   = local.control_plane_url
  redis_ca_pem        = local.redis_ca_pem
  secrets             = local.edge_secrets
  deletion_protection = var.deletion_protection
  labels              = var.labels

  depends_on = [google_secret_manager_secret_version.external]
}

module "load_balancer" {
  source = "../global-lb"

  project_id      = var.project_id
  name            = var.name
  api_domain_name = local.api_domain_name
  edges           = { for r, e in module.edge : r => { domain_name = e.domain_name, neg_id = e.neg_id } }
  control_plane = local.has_cp ? {
    domain_name = local.cp_domain_name
    neg_id      = module.control_plane[0].api_neg_id
  } : null
  dns_managed_zone = var.dns_managed_zone
}
