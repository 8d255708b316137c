data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

data "aws_subnet" "alb" {
  for_each = toset(var.public_subnet_ids)
  id       = each.value
}

locals {
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition

  batch_prefix = "batches"

  # What every role (api, worker, batch-worker, beat) is told about its surroundings, in the
  # NIMBUS_* variables of controlplane/config.py. Credentials come as secrets.
  environment = merge(var.environment, {
    NIMBUS_PUBLIC_URL   = "https://${var.domain_name}"
    NIMBUS_CLUSTER_NAME = var.cluster_name
    NIMBUS_STATE_DIR    = "/tmp/nimbus"
    NIMBUS_API_PORT     = tostring(var.api_port)
    AWS_REGION          = data.aws_region.current.name
    # uvicorn takes the client address from X-Forwarded-For only when the peer is one of
    # these. The API's security group admits the load balancer alone, whose nodes live in
    # the public subnets; trusting "*" instead would let a client pick its own address
    # (the ALB appends to a client-sent header) and so dodge the per-address sign-in throttle.
    FORWARDED_ALLOW_IPS = join(",", sort([for s in data.aws_subnet.alb : s.cidr_block]))
    # Batch API files (infra/objectstore.py), under the KMS key the rest of the bucket uses.
    NIMBUS_BATCH_STORE_URL        = "s3://${var.batch_bucket.id}/${local.batch_prefix}"
    NIMBUS_BATCH_STORE_KMS_KEY_ID = var.batch_bucket.kms_key_arn
  })

  secrets = {
    NIMBUS_DATABASE_URL   = aws_secretsmanager_secret.this["database-url"].arn
    NIMBUS_BROKER_URL     = aws_secretsmanager_secret.this["broker-url"].arn
    NIMBUS_REDIS_URL      = aws_secretsmanager_secret.this["redis-url"].arn
    NIMBUS_ADMIN_TOKEN    = aws_secretsmanager_secret.this["admin-token"].arn
    NIMBUS_EDGE_TOKEN     = aws_secretsmanager_secret.this["edge-token"].arn
    NIMBUS_SESSION_SECRET = aws_secretsmanager_secret.this["session-secret"].arn
  }

  # One service per role, all from the same image, task role and security group;
  # environment adds a role's own variables to the shared ones above.
  roles = {
    api = {
      command       = ["api"]
      desired_count = var.api_count
      cpu           = var.task_size.cpu
      memory        = var.task_size.memory
      load_balancer = { target_group_arn = module.alb.target_group_arn, container_port = var.api_port }
      environment   = {}
    }
    # Consumes the default `celery` queue only: the fleet's short periodic ticks.
    worker = {
      command       = ["worker"]
      desired_count = var.worker_count
      cpu           = var.task_size.cpu
      memory        = var.task_size.memory
      load_balancer = null
      environment   = {}
    }
    # Consumes the `batches` queue only: Batch API runs that can take hours, each line
    # sent through the primary region's edge with the edge token.
    batch-worker = {
      command       = ["batch-worker"]
      desired_count = var.batch_worker_count
      cpu           = var.task_size.cpu
      memory        = var.task_size.memory
      load_balancer = null
      environment   = { NIMBUS_BATCH_EDGE_URL = var.batch_edge_url }
    }
    # Exactly one beat: two schedulers would fire every periodic task twice.
    beat = {
      command       = ["beat"]
      desired_count = 1
      cpu           = 256
      memory        = 512
      load_balancer = null
      environment   = {}
    }
  }
}

resource "aws_ecs_cluster" "this" {
  name = var.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }

  configuration {
    execute_command_configuration {
      kms_key_id = var.kms_key_arn
      logging    = "OVERRIDE"
      log_configuration {
        cloud_watch_encryption_enabled = true
        cloud_watch_log_group_name     = aws_cloudwatch_log_group.exec.name
      }
    }
  }

  tags = var.tags
}

resource "aws_cloudwatch_log_group" "exec" {
  name              = "/nimbus/ecs/${var.name}-exec"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

module "alb" {
  source = "../https-alb"

  name                = "${var.name}-cp"
  vpc_id              = var.vpc_id
  vpc_cidr            = var.vpc_cidr
  public_subnet_ids   = var.public_subnet_ids
  target_port         = var.api_port
  health_check_path   = "/healthz"
  domain_name         = var.domain_name
  zone_id             = var.zone_id
  log_bucket_id       = var.log_bucket_id
  kms_key_arn         = var.kms_key_arn
  log_retention_days  = var.log_retention_days
  deletion_protection = var.deletion_protection
  tags                = var.tags
}

resource "aws_security_group" "services" {
  #checkov:skip=CKV2_AWS_5:Attached to the Fargate tasks through the ecs-service module (network_configuration.security_groups), which the graph check does not follow.
  name_prefix = "${var.name}-cp-services-"
  description = "Control plane tasks: API traffic from the load balancer only"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = "${var.name}-cp-services" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "api_from_alb" {
  security_group_id            = aws_security_group.services.id
  description                  = "API from the load balancer"
  referenced_security_group_id = module.alb.security_group_id
  ip_protocol                  = "tcp"
  from_port                    = var.api_port
  to_port                      = var.api_port
}

resource "aws_vpc_security_group_egress_rule" "services_postgres" {
  security_group_id            = aws_security_group.services.id
  description                  = "Postgres"
  referenced_security_group_id = aws_security_group.postgres.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_vpc_security_group_egress_rule" "services_redis" {
  security_group_id            = aws_security_group.services.id
  description                  = "Redis"
  referenced_security_group_id = aws_security_group.redis.id
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
}

# Cloud APIs (EC2 in every region, Compute Engine in multicloud) and node agents.
resource "aws_vpc_security_group_egress_rule" "services_https" {
  security_group_id = aws_security_group.services.id
  description       = "HTTPS to cloud APIs"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "services_agents" {
  for_each = toset(var.node_cidrs)

  security_group_id = aws_security_group.services.id
  description       = "Node agents in ${each.key}"
  cidr_ipv4         = each.key
  ip_protocol       = "tcp"
  from_port         = var.agent_port
  to_port           = var.agent_port
}

module "service" {
  source   = "../ecs-service"
  for_each = local.roles

  name               = "${var.name}-${each.key}"
  cluster_arn        = aws_ecs_cluster.this.arn
  image              = var.image
  command            = each.value.command
  environment        = merge(local.environment, each.value.environment)
  secrets            = local.secrets
  cpu                = each.value.cpu
  memory             = each.value.memory
  desired_count      = each.value.desired_count
  subnet_ids         = var.private_subnet_ids
  security_group_ids = [aws_security_group.services.id]
  execution_role_arn = aws_iam_role.execution.arn
  task_role_arn      = aws_iam_role.task.arn
  load_balancer      = each.value.load_balancer
  kms_key_arn        = var.kms_key_arn
  log_retention_days = var.log_retention_days
  tags               = var.tags
}
