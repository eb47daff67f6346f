# Tide's control plane: gateway hosts, the controller host, Redis (redis.tf), the S3
# bucket for batch files and models (storage.tf), and the security groups the worker
# pools join.

data "aws_region" "current" {}
data "aws_partition" "current" {}
data "aws_caller_identity" "current" {}

locals {
  region     = data.aws_region.current.name
  partition  = data.aws_partition.current.partition
  account_id = data.aws_caller_identity.current.account_id
  tags       = merge(var.tags, { Component = "tide-control-plane" })

  # Every Tide process on the control plane shares these settings.
  environment = merge(
    {
      TIDE_ENV           = "production"
      TIDE_STORAGE_URL   = "s3://${aws_s3_bucket.files.bucket}/files"
      AWS_DEFAULT_REGION = local.region
    },
    var.environment,
    { REDIS_URL = local.redis_url },
  )
  env_file = join("\n", [for k, v in local.environment : "${k}='${v}'"])

  host_template = "${path.module}/templates/host.sh.tftpl"
  host_common = {
    python            = var.python
    tide_wheel_s3_uri = var.tide_wheel_s3_uri
    tide_wheel_sha256 = var.tide_wheel_sha256
    tide_wheel_file   = basename(var.tide_wheel_s3_uri)
    env_file          = local.env_file
    env_ssm_parameter = var.env_ssm_parameter
    region            = local.region
  }
}

# --- Security groups -----------------------------------------------------------------

resource "aws_security_group" "gateway" {
  name        = "${var.name_prefix}-gateway"
  description = "Tide gateway: the API port"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.name_prefix}-gateway" })
}

resource "aws_security_group" "controller" {
  name        = "${var.name_prefix}-controller"
  description = "Tide controller: no inbound traffic"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.name_prefix}-controller" })
}

resource "aws_security_group" "workers" {
  name        = "${var.name_prefix}-workers"
  description = "Tide workers: no inbound traffic; they pull jobs from Redis"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.name_prefix}-workers" })
}

resource "aws_security_group" "redis" {
  name        = "${var.name_prefix}-redis"
  description = "Tide Redis: reachable from the gateway, controller and workers only"
  vpc_id      = var.vpc_id
  tags        = merge(local.tags, { Name = "${var.name_prefix}-redis" })
}

resource "aws_vpc_security_group_ingress_rule" "gateway_api" {
  for_each          = toset(var.gateway_ingress_cidrs)
  security_group_id = aws_security_group.gateway.id
  description       = "Tide API"
  cidr_ipv4         = each.value
  ip_protocol       = "tcp"
  from_port         = var.gateway_port
  to_port           = var.gateway_port
}

resource "aws_vpc_security_group_ingress_rule" "redis_from" {
  for_each = {
    gateway    = aws_security_group.gateway.id
    controller = aws_security_group.controller.id
    workers    = aws_security_group.workers.id
  }
  security_group_id            = aws_security_group.redis.id
  description                  = "Redis from the ${each.key}"
  referenced_security_group_id = each.value
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
}

# Outbound: package installs, S3, the AWS APIs, Redis, webhooks.
resource "aws_vpc_security_group_egress_rule" "all" {
  for_each = {
    gateway    = aws_security_group.gateway.id
    controller = aws_security_group.controller.id
    workers    = aws_security_group.workers.id
    redis      = aws_security_group.redis.id
  }
  security_group_id = each.value
  description       = "all outbound"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "-1"
}

# --- IAM -----------------------------------------------------------------------------

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

# What every Tide host of the control plane may do: read Tide's wheel, use the files bucket.
data "aws_iam_policy_document" "files" {
  statement {
    sid       = "ReadTideWheel"
    actions   = ["s3:GetObject"]
    resources = ["arn:${local.partition}:s3:::${trimprefix(var.tide_wheel_s3_uri, "s3://")}"]
  }

  statement {
    sid       = "BatchFiles"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListBucket", "s3:GetBucketLocation"]
    resources = [aws_s3_bucket.files.arn, "${aws_s3_bucket.files.arn}/*"]
  }

  dynamic "statement" {
    for_each = var.env_ssm_parameter == "" ? [] : [1]
    content {
      sid       = "ReadEnvironmentSecret"
      actions   = ["ssm:GetParameter"]
      resources = ["arn:${local.partition}:ssm:${local.region}:${local.account_id}:parameter/${trimprefix(var.env_ssm_parameter, "/")}"]
    }
  }
}

data "aws_iam_policy_document" "controller" {
  source_policy_documents = [data.aws_iam_policy_document.files.json]

  statement {
    sid       = "ReadGroups"
    actions   = ["autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances", "ec2:DescribeInstances"]
    resources = ["*"]
  }

  statement {
    sid       = "ScalePools"
    actions   = ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup", "autoscaling:SetInstanceProtection", "autoscaling:CompleteLifecycleAction"]
    resources = ["arn:${local.partition}:autoscaling:${local.region}:${local.account_id}:autoScalingGroup:*:autoScalingGroupName/${var.name_prefix}-*"]
  }

  statement {
    sid       = "PublishMetrics"
    actions   = ["cloudwatch:PutMetricData"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "cloudwatch:namespace"
      values   = [var.cloudwatch_namespace]
    }
  }
}

resource "aws_iam_role" "host" {
  for_each           = toset(concat(["gateway", "controller"], var.redis_backend == "instance" ? ["redis"] : []))
  name               = "${var.name_prefix}-${each.key}"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
  tags               = local.tags
}

resource "aws_iam_role_policy" "gateway" {
  name   = "tide-gateway"
  role   = aws_iam_role.host["gateway"].id
  policy = data.aws_iam_policy_document.files.json
}

resource "aws_iam_role_policy" "controller" {
  name   = "tide-controller"
  role   = aws_iam_role.host["controller"].id
  policy = data.aws_iam_policy_document.controller.json
}

# Shell access through SSM Session Manager instead of SSH keys.
resource "aws_iam_role_policy_attachment" "ssm" {
  for_each   = aws_iam_role.host
  role       = each.value.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_instance_profile" "host" {
  for_each = aws_iam_role.host
  name     = each.value.name
  role     = each.value.name
  tags     = local.tags
}

# --- Launch templates and hosts ------------------------------------------------------

locals {
  hosts = {
    gateway = {
      instance_type = var.gateway_instance_type
      sg            = aws_security_group.gateway.id
      volume_gb     = 30
      user_data = templatefile(local.host_template, merge(local.host_common, {
        role  = "gateway"
        files = {}
        services = {
          tide-gateway = "/opt/tide/venv/bin/uvicorn tide_fleet.gateway.app:app --host 0.0.0.0 --port ${var.gateway_port}"
        }
      }))
    }
    controller = {
      instance_type = var.controller_instance_type
      sg            = aws_security_group.controller.id
      volume_gb     = 30
      user_data = templatefile(local.host_template, merge(local.host_common, {
        role  = "controller"
        files = { "/etc/tide/fleet.toml" = base64encode(var.fleet_toml) }
        services = {
          # The controller also runs the lease reaper and the batch supervisor.
          tide-controller = "/opt/tide/venv/bin/tide controller --fleet /etc/tide/fleet.toml --actuator aws"
          tide-celery     = "/opt/tide/venv/bin/celery -A tide_fleet.infra.jobs.celery_app:celery_app worker -Q tide.webhooks,tide.batches --concurrency 4"
        }
      }))
    }
  }
}

resource "aws_launch_template" "host" {
  for_each               = local.hosts
  name                   = "${var.name_prefix}-${each.key}"
  description            = "Tide ${each.key} host"
  image_id               = var.ami_id
  instance_type          = each.value.instance_type
  key_name               = var.key_name
  user_data              = base64encode(each.value.user_data)
  update_default_version = true

  iam_instance_profile {
    arn = aws_iam_instance_profile.host[each.key].arn
  }

  vpc_security_group_ids = [each.value.sg]

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = var.root_device_name
    ebs {
      volume_size           = each.value.volume_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "${var.name_prefix}-${each.key}", Role = each.key })
  }

  tags = local.tags
}

# A changed launch template (user data, AMI) replaces the stateless hosts.
resource "aws_instance" "gateway" {
  count                       = var.gateway_count
  subnet_id                   = element(var.subnet_ids, count.index)
  associate_public_ip_address = var.associate_public_ip

  launch_template {
    id      = aws_launch_template.host["gateway"].id
    version = aws_launch_template.host["gateway"].latest_version
  }

  tags = merge(local.tags, { Name = "${var.name_prefix}-gateway-${count.index}", Role = "gateway" })
}

resource "aws_instance" "controller" {
  subnet_id = var.subnet_ids[0]

  launch_template {
    id      = aws_launch_template.host["controller"].id
    version = aws_launch_template.host["controller"].latest_version
  }

  tags = merge(local.tags, { Name = "${var.name_prefix}-controller", Role = "controller" })
}
