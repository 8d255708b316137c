# Every credential is generated here and handed to the services only through Secrets
# Manager, as the NIMBUS_* variables controlplane/config.py and the edge read. The
# values also live in the Terraform state, which must be stored encrypted.

# Letters and digits only: the values are embedded in URLs, and ElastiCache AUTH
# tokens refuse spaces, quotes, @ and /.
resource "random_password" "this" {
  for_each = toset(["database", "redis", "admin-token", "edge-token", "session-secret"])

  length  = 48
  special = false
}

locals {
  redis_auth = random_password.this["redis"].result
  redis_base = "rediss://:${local.redis_auth}@${aws_elasticache_replication_group.this.primary_endpoint_address}:${aws_elasticache_replication_group.this.port}"

  # Secret name => value. Names are static so they can key for_each; values are not.
  secret_names = toset(["database-url", "broker-url", "redis-url", "admin-token", "edge-token", "session-secret"])
  secret_values = {
    database-url   = "postgresql+psycopg://${aws_db_instance.this.username}:${random_password.this["database"].result}@${aws_db_instance.this.address}:${aws_db_instance.this.port}/${aws_db_instance.this.db_name}?sslmode=require"
    broker-url     = "${local.redis_base}/1?ssl_cert_reqs=required"
    redis-url      = "${local.redis_base}/0"
    admin-token    = random_password.this["admin-token"].result
    edge-token     = random_password.this["edge-token"].result
    session-secret = random_password.this["session-secret"].result
  }
}

resource "aws_secretsmanager_secret" "this" {
  #checkov:skip=CKV2_AWS_57:Rotation means regenerating the random_password and redeploying the services (RDS password and ElastiCache AUTH with its ROTATE strategy change together); a Lambda rotator would fight Terraform over the value.
  for_each = local.secret_names

  name_prefix = "${var.name}/${each.key}-"
  description = "Nimbus control plane ${each.key}"
  kms_key_id  = var.kms_key_arn
  tags        = var.tags
}

resource "aws_secretsmanager_secret_version" "this" {
  for_each = local.secret_names

  secret_id     = aws_secretsmanager_secret.this[each.key].id
  secret_string = local.secret_values[each.key]
}
