output "bucket_id" {
  description = "Name of the log bucket."
  value       = aws_s3_bucket.this.id
}

output "bucket_arn" {
  description = "ARN of the log bucket."
  value       = aws_s3_bucket.this.arn
}

output "alb_prefix" {
  description = "Key prefix ALBs must write their access logs under."
  value       = "alb"
}

output "s3_prefix" {
  description = "Key prefix S3 server access logs must be written under (append the bucket name)."
  value       = "s3"
}
