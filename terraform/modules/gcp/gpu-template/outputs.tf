output "template_id" {
  description = "Self link of the regional instance template, as written into the cloud catalog."
  value       = google_compute_region_instance_template.this.self_link
}

output "template_name" {
  description = "Name of the regional instance template."
  value       = google_compute_region_instance_template.this.name
}

output "service_account_email" {
  description = "GPU node service account (the control plane needs actAs on it)."
  value       = google_service_account.node.email
}

output "service_account_id" {
  description = "Fully qualified id of the GPU node service account."
  value       = google_service_account.node.id
}
