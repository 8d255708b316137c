output "key_ids" {
  description = "Id of the data key per region."
  value       = { for region, key in google_kms_crypto_key.this : region => key.id }

  # Consumers must not create encrypted resources before the service agents may use the key.
  depends_on = [google_kms_crypto_key_iam_member.service_agents]
}
