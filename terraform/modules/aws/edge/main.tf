data "aws_region" "current" {}
data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  region    = data.aws_region.current.name
  full_name = "${var.name}-edge-${local.region}"

  # The edge reaches engines and agents on GPU nodes in every CIDR it serves.
  node_egress = merge([
    for cidr in var.node_cidrs : {
      "${cidr}-engines" = { cidr = cidr, from = var.engine_ports.from, to = var.engine_ports.to }
      "${cidr}-agent"   = { cidr = cidr, from = var.agent_port, to = var.agent_port }
    }
  ]...)
}

resource "aws_cloudwatch_log_group" "exec" {
  name              = "/nimbus/ecs/${local.full_name}-exec"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
  tags              = var.tags
}

resource "aws_ecs_cluster" "this" {
  name = local.full_name

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

module "alb" {
  source = "../https-alb"

  name                      = var.short_name
  vpc_id                    = var.vpc_id
  vpc_cidr                  = var.vpc_cidr
  public_subnet_ids         = var.public_subnet_ids
  target_port               = var.port
  health_check_path         = "/health"
  domain_name               = var.domain_name
  subject_alternative_names = [var.global_domain_name]
  zone_id                   = var.zone_id
  idle_timeout              = 900
  log_bucket_id             = var.log_bucket_id
  kms_key_arn               = var.kms_key_arn
  log_retention_days        = var.log_retention_days
  deletion_protection       = var.deletion_protection
  tags                      = var.tags
}

resource "aws_security_group" "edge" {
  #checkov:skip=CKV2_AWS_5:Attached to the Fargate tasks through the ecs-service module (network_configuration.security_groups), which the graph check does not follow.
  name_prefix = "${local.full_name}-"
  description = "Edge tasks: client traffic from the load balancer only"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = local.full_name })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "from_alb" {
  security_group_id            = aws_security_group.edge.id
  description                  = "Client traffic from the load balancer"
  referenced_security_group_id = module.alb.security_group_id
  ip_protocol                  = "tcp"
  from_port                    = var.port
  to_port                      = var.port
}

resource "aws_vpc_security_group_egress_rule" "https" {
  security_group_id = aws_security_group.edge.id
  description       = "HTTPS to the control plane and AWS APIs"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "redis" {
  security_group_id = aws_security_group.edge.id
  description       = "Redis of the control plane"
  cidr_ipv4         = var.redis_cidr
  ip_protocol       = "tcp"
  from_port         = var.redis_port
  to_port           = var.redis_port
}

resource "aws_vpc_security_group_egress_rule" "nodes" {
  for_each = local.node_egress

  security_group_id = aws_security_group.edge.id
  description       = "GPU nodes ${each.key}"
  cidr_ipv4         = each.value.cidr
  ip_protocol       = "tcp"
  from_port         = each.value.from
  to_port           = each.value.to
}

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
}

resource "aws_iam_role" "execution" {
  name_prefix        = "${var.name}-edge-exec-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

data "aws_iam_policy_document" "execution_secrets" {
  statement {
    sid       = "ReadEdgeSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = distinct(values(var.secrets))
  }

  statement {
    sid       = "DecryptEdgeSecrets"
    actions   = ["kms:Decrypt"]
    resources = [var.secrets_kms_key_arn]
    condition {
      test     = "StringLike"
      variable = "kms:ViaService"
      values   = ["secretsmanager.*.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "execution_secrets" {
  name   = "read-edge-secrets"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution_secrets.json
}

# The edge calls no AWS API itself; its task role exists so it is not the execution role.
resource "aws_iam_role" "task" {
  name_prefix        = "${var.name}-edge-task-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

module "service" {
  source = "../ecs-service"

  name        = local.full_name
  cluster_arn = aws_ecs_cluster.this.arn
  image       = var.image
  command     = ["edge"]
  # The edge's settings (dataplane/edge/settings.py) as NIMBUS_EDGE_* variables.
  environment = {
    NIMBUS_CONTROL_PLANE_URL = var.control_plane_url
    NIMBUS_EDGE_HOST         = "0.0.0.0"
    NIMBUS_EDGE_PORT         = tostring(var.port)
    NIMBUS_EDGE_REGION       = local.region
    NIMBUS_EDGE_STATE_DIR    = "/tmp/edge"
  }
  secrets            = var.secrets
  cpu                = var.task_size.cpu
  memory             = var.task_size.memory
  desired_count      = var.desired_count
  subnet_ids         = var.private_subnet_ids
  security_group_ids = [aws_security_group.edge.id]
  execution_role_arn = aws_iam_role.execution.arn
  task_role_arn      = aws_iam_role.task.arn
  load_balancer      = { target_group_arn = module.alb.target_group_arn, container_port = var.port }
  kms_key_arn        = var.kms_key_arn
  log_retention_days = var.log_retention_days
  tags               = var.tags
}
