data "aws_region" "current" {}
data "aws_partition" "current" {}

data "aws_ssm_parameter" "deep_learning_ami" {
  count = var.ami_id == null ? 1 : 0
  name  = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
}

locals {
  region    = data.aws_region.current.name
  full_name = "${var.name}-gpu-${local.region}"
  ami_id    = var.ami_id != null ? var.ami_id : nonsensitive(data.aws_ssm_parameter.deep_learning_ami[0].value)

  # Ownership tags the sweeper and the control plane's IAM conditions rely on; the
  # provider adds nimbus-node-id and nimbus-pool-id per launch.
  ownership_tags = {
    managed-by     = "nimbus"
    nimbus-cluster = var.cluster_name
  }

  # Every admitted source reaches both the engines and the agent.
  admitted_ports = {
    engines = var.engine_ports
    agent   = { from = var.agent_port, to = var.agent_port }
  }
  sg_rules = merge([
    for source, sg_id in var.admitted_security_groups : {
      for port_name, ports in local.admitted_ports : "${source}-${port_name}" => { source = sg_id, ports = ports }
    }
  ]...)
  cidr_rules = merge([
    for label, cidr in var.admitted_cidrs : {
      for port_name, ports in local.admitted_ports : "${label}-${port_name}" => { source = cidr, ports = ports }
    }
  ]...)
}

resource "aws_security_group" "node" {
  name_prefix = "${local.full_name}-"
  description = "GPU nodes: engines and agent reachable from the edge and the control plane only"
  vpc_id      = var.vpc_id
  tags        = merge(var.tags, { Name = local.full_name })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "from_security_groups" {
  for_each = local.sg_rules

  security_group_id            = aws_security_group.node.id
  description                  = "${each.key} ports"
  referenced_security_group_id = each.value.source
  ip_protocol                  = "tcp"
  from_port                    = each.value.ports.from
  to_port                      = each.value.ports.to
}

resource "aws_vpc_security_group_ingress_rule" "from_cidrs" {
  for_each = local.cidr_rules

  security_group_id = aws_security_group.node.id
  description       = "${each.key} ports"
  cidr_ipv4         = each.value.source
  ip_protocol       = "tcp"
  from_port         = each.value.ports.from
  to_port           = each.value.ports.to
}

# Nodes reach the control plane, the artifact bucket (S3 endpoint) and model hubs
# over HTTPS only.
resource "aws_vpc_security_group_egress_rule" "https" {
  security_group_id = aws_security_group.node.id
  description       = "HTTPS to the control plane, S3 and model hubs"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  name_prefix        = "${var.name}-gpu-node-"
  description        = "Nimbus GPU node agent in ${local.region}"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

# What the agent does with AWS (dataplane/agent/artifacts.py): list and read model
# weights in the regional bucket. Nothing else; it never writes there.
data "aws_iam_policy_document" "node" {
  statement {
    sid       = "ListWeights"
    actions   = ["s3:ListBucket"]
    resources = [var.artifact_bucket_arn]
  }

  statement {
    sid       = "ReadWeights"
    actions   = ["s3:GetObject"]
    resources = ["${var.artifact_bucket_arn}/*"]
  }

  statement {
    sid       = "UseBucketKey"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${local.region}.amazonaws.com"]
    }
  }

  dynamic "statement" {
    for_each = length(var.image_repository_arns) > 0 ? [1] : []
    content {
      sid       = "PullNimbusImage"
      actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
      resources = var.image_repository_arns
    }
  }

  # The ECR token call has no resource-level permissions.
  dynamic "statement" {
    for_each = length(var.image_repository_arns) > 0 ? [1] : []
    content {
      sid       = "GetRegistryToken"
      actions   = ["ecr:GetAuthorizationToken"]
      resources = ["*"]
    }
  }
}

resource "aws_iam_role_policy" "node" {
  name   = "gpu-node-agent"
  role   = aws_iam_role.node.id
  policy = data.aws_iam_policy_document.node.json
}

resource "aws_iam_instance_profile" "node" {
  name_prefix = "${var.name}-gpu-node-"
  role        = aws_iam_role.node.name
  tags        = var.tags
}

resource "aws_launch_template" "this" {
  name                   = local.full_name
  description            = "Nimbus GPU node; launched by the control plane, never by Terraform"
  image_id               = local.ami_id
  instance_type          = var.default_instance_type
  update_default_version = true
  ebs_optimized          = true
  vpc_security_group_ids = [aws_security_group.node.id]

  iam_instance_profile {
    arn = aws_iam_instance_profile.node.arn
  }

  # IMDSv2 only, one hop: the agent runs on the host network, so no container can
  # reach instance credentials through a bridge.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "enabled"
  }

  block_device_mappings {
    device_name = "/dev/sda1"
    ebs {
      volume_size           = var.root_volume_size_gb
      volume_type           = "gp3"
      throughput            = 1000
      iops                  = 16000
      encrypted             = true
      kms_key_id            = var.kms_key_arn
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  # Nodes are cattle: stopping one would strand its GPUs, so shutdown terminates it.
  instance_initiated_shutdown_behavior = "terminate"

  dynamic "tag_specifications" {
    for_each = toset(["instance", "volume", "network-interface"])
    content {
      resource_type = tag_specifications.key
      tags          = merge(var.tags, local.ownership_tags)
    }
  }

  tags = merge(var.tags, local.ownership_tags)
}
