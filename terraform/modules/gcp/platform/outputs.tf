output "api_url" {
  description = "HTTPS URL tenants call (anycast, nearest edge)."
  value       = "https://${local.api_domain_name}"
}

output "control_plane_url" {
  description = "HTTPS URL of the control plane the edges talk to."
  value       = local.control_plane_url
}

output "load_balancer_ip" {
  description = "Anycast address of the global load balancer."
  value       = module.load_balancer.ip_address
}

output "edge_domain_names" {
  description = "Regional edge names by region (each needs an A record to load_balancer_ip when DNS is elsewhere)."
  value       = { for r, e in module.edge : r => e.domain_name }
}

output "provisioner_service_account" {
  description = "Service account the control plane provisions GCP nodes as."
  value       = module.provisioner.service_account_email
}

output "workload_identity_provider" {
  description = "Workload identity provider an AWS-hosted control plane exchanges its credentials with (null otherwise)."
  value       = module.provisioner.workload_identity_provider
}

output "gpu_service_accounts" {
  description = "GPU node service account email by region."
  value       = { for r, t in module.gpu_template : r => t.service_account_email }
}

output "catalog_regions" {
  description = "Cloud catalog entries by region, without zones' names and instance_types (the environment adds those)."
  value = {
    for r in local.regions : r => {
      name            = r
      edge_url        = module.edge[r].url
      artifact_bucket = module.artifacts[r].url
      template = {
        kind = "gcp_instance_template"
        id   = module.gpu_template[r].template_id
        name = module.gpu_template[r].template_name
      }
      subnet = module.network.node_subnets[r]
    }
  }
}

output "network_id" {
  description = "Id of the VPC network (a VPN to another cloud attaches here)."
  value       = module.network.network_id
}
