# Two roles, on purpose: ECS uses the execution role to start tasks (pull the image,
# read the secrets, write logs); the application runs as the task role, which holds
# only the EC2 calls the AWS provider in infra/aws makes.

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
      values   = [local.account_id]
    }
  }
}

resource "aws_iam_role" "execution" {
  name_prefix        = "${var.name}-cp-exec-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

data "aws_iam_policy_document" "execution_secrets" {
  statement {
    sid       = "ReadServiceSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [for secret in aws_secretsmanager_secret.this : secret.arn]
  }

  statement {
    sid       = "DecryptServiceSecrets"
    actions   = ["kms:Decrypt"]
    resources = [var.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${data.aws_region.current.name}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "execution_secrets" {
  name   = "read-service-secrets"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution_secrets.json
}

resource "aws_iam_role" "task" {
  name_prefix        = "${var.name}-cp-task-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = var.tags
}

locals {
  ec2_arn = "arn:${local.partition}:ec2:*:${local.account_id}"
}

data "aws_iam_policy_document" "provision" {
  # RunInstances authorizes every resource it touches separately; each statement
  # below covers one group of them.
  statement {
    sid       = "LaunchFromNimbusTemplates"
    actions   = ["ec2:RunInstances"]
    resources = var.gpu_launch_template_arns
  }

  # New instances and volumes must carry the ownership tags the provider sets and
  # come from one of the Nimbus templates. nimbus-pool-id is not required: the
  # provider sets it only for nodes that belong to a pool.
  statement {
    sid     = "LaunchTaggedNodes"
    actions = ["ec2:RunInstances"]
    resources = [
      "${local.ec2_arn}:instance/*",
      "${local.ec2_arn}:volume/*",
    ]
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/managed-by"
      values   = ["nimbus"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/nimbus-cluster"
      values   = [var.cluster_name]
    }
    condition {
      test     = "Null"
      variable = "aws:RequestTag/nimbus-node-id"
      values   = ["false"]
    }
    condition {
      test     = "ArnLike"
      variable = "ec2:LaunchTemplate"
      values   = var.gpu_launch_template_arns
    }
  }

  statement {
    sid     = "LaunchIntoNimbusNetworks"
    actions = ["ec2:RunInstances"]
    resources = [
      "${local.ec2_arn}:subnet/*",
      "${local.ec2_arn}:security-group/*",
      "${local.ec2_arn}:network-interface/*",
    ]
    condition {
      test     = "ArnEquals"
      variable = "ec2:Vpc"
      values   = var.gpu_vpc_arns
    }
  }

  # GPU images are public AWS images (Deep Learning AMIs) or the account's own.
  statement {
    sid     = "LaunchFromTrustedImages"
    actions = ["ec2:RunInstances"]
    resources = [
      "arn:${local.partition}:ec2:*::image/*",
      "arn:${local.partition}:ec2:*::snapshot/*",
    ]
    condition {
      test     = "StringEquals"
      variable = "ec2:Owner"
      values   = ["amazon", local.account_id]
    }
  }

  # Tags may only be written as part of the launch that creates the resource.
  statement {
    sid     = "TagOnLaunch"
    actions = ["ec2:CreateTags"]
    resources = [
      "${local.ec2_arn}:instance/*",
      "${local.ec2_arn}:volume/*",
      "${local.ec2_arn}:network-interface/*",
    ]
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["RunInstances"]
    }
  }

  statement {
    sid       = "TerminateOwnNodes"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.ec2_arn}:instance/*"]
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/managed-by"
      values   = ["nimbus"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/nimbus-cluster"
      values   = [var.cluster_name]
    }
  }

  # Describe calls do not support resource-level permissions.
  statement {
    sid = "DescribeNodesAndTemplates"
    actions = [
      "ec2:DescribeInstances",
      "ec2:DescribeLaunchTemplates",
      "ec2:DescribeLaunchTemplateVersions",
    ]
    resources = ["*"]
  }

  statement {
    sid       = "PassGpuNodeRole"
    actions   = ["iam:PassRole"]
    resources = var.gpu_instance_role_arns
    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }

  # Launching with volumes encrypted by a customer key makes EC2 create a grant on
  # that key in the caller's name; only through EC2, only for these keys.
  statement {
    sid = "EncryptGpuVolumes"
    actions = [
      "kms:CreateGrant",
      "kms:Decrypt",
      "kms:DescribeKey",
      "kms:GenerateDataKeyWithoutPlaintext",
      "kms:ReEncrypt*",
    ]
    resources = var.gpu_kms_key_arns
    condition {
      test     = "StringLike"
      variable = "kms:ViaService"
      values   = ["ec2.*.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "provision" {
  name   = "provision-gpu-nodes"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.provision.json
}

# The Batch API's files (tenant JSONL input, output and error files) live under the
# batches/ prefix of the region's artifact bucket; the API and the workers read, write
# and delete there and nowhere else in the bucket (model weights stay read-only to
# nodes and untouched by the control plane).
data "aws_iam_policy_document" "batch_files" {
  statement {
    sid       = "ReadWriteBatchFiles"
    actions   = ["s3:PutObject", "s3:GetObject", "s3:DeleteObject"]
    resources = ["${var.batch_bucket.arn}/${local.batch_prefix}/*"]
  }

  # Without s3:ListBucket, S3 answers 403 instead of 404 for a key that does not
  # exist, and a missing file would look like a permission error. A GetObject or
  # HeadObject request carries no s3:prefix, so a prefix condition here would not
  # give those honest 404s; listing reveals key names only, never contents.
  statement {
    sid       = "TellMissingBatchFilesApart"
    actions   = ["s3:ListBucket"]
    resources = [var.batch_bucket.arn]
  }

  # The bucket is encrypted with a customer key: writing needs a data key, reading
  # needs to decrypt it; only through S3, only for this bucket's objects.
  statement {
    sid       = "EncryptBatchFiles"
    actions   = ["kms:GenerateDataKey", "kms:Decrypt"]
    resources = [var.batch_bucket.kms_key_arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${data.aws_region.current.name}.amazonaws.com"]
    }
    # With bucket keys the context names the bucket; without them, the object.
    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:s3:arn"
      values   = [var.batch_bucket.arn, "${var.batch_bucket.arn}/${local.batch_prefix}/*"]
    }
  }
}

resource "aws_iam_role_policy" "batch_files" {
  name   = "batch-files"
  role   = aws_iam_role.task.id
  policy = data.aws_iam_policy_document.batch_files.json
}
