output "service_account_email" {
  description = "Email of the provisioner service account (the control plane's identity in GCP)."
  value       = google_service_account.this.email
}

output "workload_identity_provider" {
  description = "Full name of the workload identity provider the AWS control plane exchanges tokens with; null when the control plane runs in GCP."
  value       = var.aws_workload_identity == null ? null : google_iam_workload_identity_pool_provider.aws[0].name
}
