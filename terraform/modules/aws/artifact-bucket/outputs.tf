output "bucket_id" {
  description = "Name of the artifact bucket."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "ARN of the artifact bucket."
  value       = aws_s3_bucket.this.arn
}

output "url" {
  description = "s3:// URL of the artifact bucket, as written into the cloud catalog."
  value       = "s3://${aws_s3_bucket.this.id}"
}
