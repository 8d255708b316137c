output "network_id" {
  description = "Id of the VPC network."
  value       = google_compute_network.this.id
}

output "network_self_link" {
  description = "Self link of the VPC network."
  value       = google_compute_network.this.self_link
}

output "node_subnets" {
  description = "Self link of the GPU node subnet per region (written into the cloud catalog)."
  value       = { for region, subnet in google_compute_subnetwork.nodes : region => subnet.self_link }
}

output "service_subnets" {
  description = "Self link of the Cloud Run egress subnet per region."
  value       = { for region, subnet in google_compute_subnetwork.services : region => subnet.self_link }
}

output "network_tags" {
  description = "Network tags the firewall rules key on: gpu, edge, control_plane."
  value       = local.tags
}

output "private_services_network_id" {
  description = "Network id read from the private services connection: Cloud SQL and Memorystore given this wait for the peering."
  value       = google_service_networking_connection.private_services.network
}
