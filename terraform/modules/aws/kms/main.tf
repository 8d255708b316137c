data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  region     = data.aws_region.current.name
}

# One customer-managed key per region encrypts every Nimbus data store there (RDS,
# ElastiCache, Secrets Manager, S3, EBS, CloudWatch Logs), so revoking it cuts off the
# whole regional footprint in one place.
resource "aws_kms_key" "this" {
  description             = "Nimbus data encryption key (${local.region})"
  enable_key_rotation     = true
  deletion_window_in_days = var.deletion_window_in_days

  # In a key policy "*" means "this key". The account statement delegates access to
  # IAM policies; CloudWatch Logs needs its own statement because it is a service
  # principal, scoped to this account's log groups in this region.
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "AccountIamPoliciesGrantAccess"
        Effect    = "Allow"
        Principal = { AWS = "arn:${local.partition}:iam::${local.account_id}:root" }
        Action    = "kms:*"
        Resource  = "*"
      },
      {
        Sid       = "CloudWatchLogsUseKey"
        Effect    = "Allow"
        Principal = { Service = "logs.${local.region}.amazonaws.com" }
        Action    = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
        Resource  = "*"
        Condition = {
          ArnLike = {
            "kms:EncryptionContext:aws:logs:arn" = "arn:${local.partition}:logs:${local.region}:${local.account_id}:log-group:*"
          }
        }
      },
    ]
  })

  tags = var.tags
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.name}-${local.region}"
  target_key_id = aws_kms_key.this.key_id
}
