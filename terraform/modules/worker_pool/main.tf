# One Tide worker pool: an Auto Scaling group whose instances run `tide worker` for the
# pool's buckets. The Tide controller owns desired capacity; Terraform owns the shape.

data "aws_region" "current" {}
data "aws_partition" "current" {}
data "aws_caller_identity" "current" {}

locals {
  name      = "${var.name_prefix}-${var.pool_name}"
  hook_name = "tide-drain"
  # Spot, or a choice of instance types, needs a mixed instances policy.
  mixed = var.spot || length(var.instance_types) > 1
  tags  = merge(var.tags, { Pool = var.pool_name })

  model_is_s3 = startswith(var.model, "s3://")
  model_local = local.model_is_s3 ? "/var/lib/tide/model" : var.model
  # The model's own bucket is always readable, whatever model_bucket_arns says.
  read_bucket_arns = distinct(concat(
    var.model_bucket_arns,
    local.model_is_s3 ? ["arn:${data.aws_partition.current.partition}:s3:::${split("/", trimprefix(var.model, "s3://"))[0]}"] : [],
  ))

  # The worker drains a little inside the hook's timeout, so the hook is completed
  # (not timed out) and its re-queued jobs are back in Redis before the instance goes.
  worker_drain_s = max(var.drain_timeout_s - 15, 15)

  environment = merge(
    {
      TIDE_ENV           = "production"
      TIDE_DRAIN_TIMEOUT = tostring(local.worker_drain_s)
      AWS_DEFAULT_REGION = data.aws_region.current.name
      # The worker follows its own termination (infra/fleet/aws_lifecycle.py): it drains, then
      # completes this hook.
      TIDE_AWS_REGION         = data.aws_region.current.name
      TIDE_AWS_ASG_NAME       = local.name
      TIDE_AWS_LIFECYCLE_HOOK = local.hook_name
      # A fixed metrics port for Prometheus (EC2 service discovery); tide doctor reads the
      # URL from the heartbeat.
      TIDE_WORKER_METRICS_HOST = "0.0.0.0"
      TIDE_WORKER_METRICS_PORT = "9400"
    },
    var.environment,
    { REDIS_URL = var.redis_url },
  )

  worker_argv = concat(
    ["--pool", var.pool_name, "--buckets", join(",", var.buckets)],
    local.model_local == "" ? [] : ["--model", local.model_local],
    ["--tensor-parallel-size", tostring(var.gpus_per_worker)],
    var.worker_args,
  )

  asg_arn = "arn:${data.aws_partition.current.partition}:autoscaling:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:autoScalingGroup:*:autoScalingGroupName/${local.name}"
}

# --- IAM: what a worker instance may do ---------------------------------------------

data "aws_iam_policy_document" "assume_ec2" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

data "aws_iam_policy_document" "worker" {
  statement {
    sid       = "DrainOnTermination"
    actions   = ["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat", "autoscaling:SetInstanceProtection"]
    resources = [local.asg_arn]
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

  statement {
    sid       = "ReadTideWheel"
    actions   = ["s3:GetObject"]
    resources = ["arn:${data.aws_partition.current.partition}:s3:::${trimprefix(var.tide_wheel_s3_uri, "s3://")}"]
  }

  dynamic "statement" {
    for_each = length(local.read_bucket_arns) > 0 ? [1] : []
    content {
      sid       = "ReadModelsAndBatches"
      actions   = ["s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"]
      resources = concat(local.read_bucket_arns, [for arn in local.read_bucket_arns : "${arn}/*"])
    }
  }

  dynamic "statement" {
    for_each = var.env_ssm_parameter == "" ? [] : [1]
    content {
      sid       = "ReadEnvironmentSecret"
      actions   = ["ssm:GetParameter"]
      resources = ["arn:${data.aws_partition.current.partition}:ssm:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:parameter/${trimprefix(var.env_ssm_parameter, "/")}"]
    }
  }
}

resource "aws_iam_role" "worker" {
  name               = "${local.name}-worker"
  assume_role_policy = data.aws_iam_policy_document.assume_ec2.json
  tags               = local.tags
}

resource "aws_iam_role_policy" "worker" {
  name   = "tide-worker"
  role   = aws_iam_role.worker.id
  policy = data.aws_iam_policy_document.worker.json
}

resource "aws_iam_instance_profile" "worker" {
  name = "${local.name}-worker"
  role = aws_iam_role.worker.name
  tags = local.tags
}

# --- Launch template ---------------------------------------------------------------------

resource "aws_launch_template" "worker" {
  name                   = local.name
  description            = "Tide worker, pool ${var.pool_name} (${join(",", var.buckets)})"
  image_id               = var.ami_id
  instance_type          = local.mixed ? null : var.instance_types[0]
  key_name               = var.key_name
  vpc_security_group_ids = var.security_group_ids
  update_default_version = true

  user_data = base64encode(templatefile("${path.module}/templates/user_data.sh.tftpl", {
    python            = var.python
    tide_wheel_s3_uri = var.tide_wheel_s3_uri
    tide_wheel_sha256 = var.tide_wheel_sha256
    tide_wheel_file   = basename(var.tide_wheel_s3_uri)
    env_file          = join("\n", [for k, v in local.environment : "${k}='${v}'"])
    env_ssm_parameter = var.env_ssm_parameter
    region            = data.aws_region.current.name
    model             = var.model
    model_is_s3       = local.model_is_s3
    model_local       = local.model_local
    pool_name         = var.pool_name
    worker_argv       = join(" ", local.worker_argv)
    stop_timeout_s    = local.worker_drain_s + 10
    asg_name          = local.name
    hook_name         = local.hook_name
  }))

  iam_instance_profile {
    arn = aws_iam_instance_profile.worker.arn
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  dynamic "block_device_mappings" {
    for_each = var.root_volume_size_gb > 0 ? [1] : []
    content {
      device_name = var.root_device_name
      ebs {
        volume_size           = var.root_volume_size_gb
        volume_type           = "gp3"
        encrypted             = true
        delete_on_termination = true
      }
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "${local.name}-worker" })
  }

  tag_specifications {
    resource_type = "volume"
    tags          = merge(local.tags, { Name = "${local.name}-worker" })
  }

  tags = local.tags
}

# --- Auto Scaling group --------------------------------------------------------------

resource "aws_autoscaling_group" "pool" {
  name                = local.name
  min_size            = var.min_size
  max_size            = var.max_size
  desired_capacity    = var.min_size
  vpc_zone_identifier = var.subnet_ids
  # Scale-in chooses drained instances through the controller; keep AWS from
  # rebalancing zones under running jobs.
  suspended_processes       = ["AZRebalance"]
  health_check_grace_period = 300
  wait_for_capacity_timeout = "0"

  dynamic "launch_template" {
    for_each = local.mixed ? [] : [1]
    content {
      id      = aws_launch_template.worker.id
      version = "$Latest"
    }
  }

  dynamic "mixed_instances_policy" {
    for_each = local.mixed ? [1] : []
    content {
      instances_distribution {
        on_demand_allocation_strategy            = "prioritized"
        on_demand_base_capacity                  = var.spot ? var.on_demand_base : 0
        on_demand_percentage_above_base_capacity = var.spot ? 0 : 100
        spot_allocation_strategy                 = var.spot_allocation_strategy
      }
      launch_template {
        launch_template_specification {
          launch_template_id = aws_launch_template.worker.id
          version            = "$Latest"
        }
        dynamic "override" {
          for_each = var.instance_types
          content {
            instance_type = override.value
          }
        }
      }
    }
  }

  dynamic "warm_pool" {
    for_each = var.warm_pool_size > 0 ? [1] : []
    content {
      pool_state                  = "Stopped"
      min_size                    = var.warm_pool_size
      max_group_prepared_capacity = var.warm_pool_size
      instance_reuse_policy {
        reuse_on_scale_in = true
      }
    }
  }

  tag {
    key                 = "Name"
    value               = "${local.name}-worker"
    propagate_at_launch = true
  }

  dynamic "tag" {
    for_each = local.tags
    content {
      key                 = tag.key
      value               = tag.value
      propagate_at_launch = true
    }
  }

  lifecycle {
    # The Tide controller sets desired capacity; Terraform must not undo it.
    ignore_changes = [desired_capacity]

    precondition {
      condition     = var.min_size <= var.max_size
      error_message = "pool ${var.pool_name}: min_size (${var.min_size}) exceeds max_size (${var.max_size})."
    }
    precondition {
      condition     = var.warm_pool_size == 0 || !local.mixed
      error_message = "pool ${var.pool_name}: a warm pool needs on-demand capacity of one instance type (spot = false, one instance type); warm pools do not support mixed instances policies."
    }
    precondition {
      condition     = !var.spot || var.on_demand_base <= var.max_size
      error_message = "pool ${var.pool_name}: on_demand_base (${var.on_demand_base}) exceeds max_size (${var.max_size})."
    }
    precondition {
      condition     = length(local.short_of_gpus) == 0
      error_message = "pool ${var.pool_name}: a worker takes ${var.gpus_per_worker} GPUs (gpus_per_worker), more than instance types ${join(", ", local.short_of_gpus)} hold; use types with at least ${var.gpus_per_worker} GPUs (gpus.tf)."
    }
  }
}

# Termination waits (up to the drain timeout) for the instance's tide-lifecycle service to
# drain the worker and complete the action. A separate resource rather than
# initial_lifecycle_hook, so a changed drain timeout is applied; the hook also covers
# instances launched before it existed.
resource "aws_autoscaling_lifecycle_hook" "drain" {
  name                   = local.hook_name
  autoscaling_group_name = aws_autoscaling_group.pool.name
  lifecycle_transition   = "autoscaling:EC2_INSTANCE_TERMINATING"
  heartbeat_timeout      = var.drain_timeout_s
  default_result         = "CONTINUE"
}

resource "aws_autoscaling_policy" "backlog" {
  count                  = var.target_tracking ? 1 : 0
  name                   = "${local.name}-backlog-per-instance"
  autoscaling_group_name = aws_autoscaling_group.pool.name
  policy_type            = "TargetTrackingScaling"

  target_tracking_configuration {
    target_value = var.target_backlog_per_instance

    customized_metric_specification {
      metric_name = "BacklogPerInstance"
      namespace   = var.cloudwatch_namespace
      statistic   = "Average"

      metric_dimension {
        name  = "Pool"
        value = var.pool_name
      }
    }
  }

  lifecycle {
    precondition {
      condition     = var.target_backlog_per_instance > 0
      error_message = "pool ${var.pool_name}: target_tracking needs target_backlog_per_instance > 0."
    }
  }
}
