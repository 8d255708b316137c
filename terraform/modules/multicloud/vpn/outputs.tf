output "gcp_gateway_ips" {
  description = "Public addresses of the GCP HA VPN gateway interfaces."
  value       = [for i in google_compute_ha_vpn_gateway.this.vpn_interfaces : i.ip_address]
}

output "aws_vpn_connection_ids" {
  description = "Ids of the two AWS site-to-site VPN connections."
  value       = aws_vpn_connection.this[*].id
}
