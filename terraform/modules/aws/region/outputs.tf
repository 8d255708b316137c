output "region" {
  description = "AWS region of this module instance."
  value       = local.region
}

output "network" {
  description = "VPC facts other modules need: vpc_id, vpc_arn, cidr_block, subnet ids and private route tables."
  value = {
    vpc_id                  = module.network.vpc_id
    vpc_arn                 = module.network.vpc_arn
    cidr_block              = module.network.cidr_block
    private_subnet_ids      = module.network.private_subnet_ids
    public_subnet_ids       = module.network.public_subnet_ids
    private_route_table_ids = module.network.private_route_table_ids
  }
}

output "log_bucket_id" {
  description = "Regional log bucket (access logs of load balancers in this region)."
  value       = module.logs.bucket_id
}

output "artifact_bucket" {
  description = "Artifact bucket of this region: name and ARN (the control plane keeps Batch API files under its batches/ prefix)."
  value = {
    id  = module.artifacts.bucket_id
    arn = module.artifacts.bucket_arn
  }
}

output "gpu" {
  description = "GPU launch template facts for the control plane's IAM policy: template ARN, node role ARN."
  value = {
    launch_template_arn = module.gpu_template.launch_template_arn
    node_role_arn       = module.gpu_template.node_role_arn
  }
}

output "edge" {
  description = "Regional edge: its URL, own name and load balancer alias target."
  value = {
    url          = module.edge.url
    fqdn         = module.edge.domain_name
    alb_dns_name = module.edge.alb_dns_name
    alb_zone_id  = module.edge.alb_zone_id
  }
}

output "catalog_region" {
  description = "This region's entry of the cloud catalog, without instance_types (the environment adds those)."
  value = {
    name            = local.region
    edge_url        = module.edge.url
    artifact_bucket = module.artifacts.url
    template = {
      kind    = "aws_launch_template"
      id      = module.gpu_template.launch_template_id
      name    = module.gpu_template.launch_template_name
      version = module.gpu_template.launch_template_version
    }
    zones = [
      for zone in var.zones : { name = zone, subnet = module.network.private_subnets_by_zone[zone] }
    ]
  }
}
