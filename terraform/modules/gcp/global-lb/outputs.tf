output "ip_address" {
  description = "Anycast IPv4 address every hostname must resolve to."
  value       = google_compute_global_address.this.address
}

output "hostnames" {
  description = "Hostnames the certificate covers and the URL map routes."
  value       = local.hostnames
}
