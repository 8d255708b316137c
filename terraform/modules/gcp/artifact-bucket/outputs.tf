output "name" {
  description = "Name of the artifact bucket."
  value       = google_storage_bucket.this.name
}

output "url" {
  description = "gs:// URL of the artifact bucket, as written into the cloud catalog."
  value       = google_storage_bucket.this.url
}
