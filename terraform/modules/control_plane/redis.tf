# Redis holds every job record and queue. Two backends:
#
# - elasticache: a replication group with a replica in another zone, automatic failover and
#   daily snapshots. ElastiCache does not support AOF on Redis OSS 2.8.22 or later (nor on
#   Multi-AZ groups): the replica is its answer to node loss, and a failover can lose the
#   writes not yet replicated. The parameter group sets noeviction, so a full Redis refuses
#   writes instead of silently dropping jobs.
# - instance: Redis on an EC2 host with AOF (appendfsync everysec), as Tide runs it locally.

locals {
  elasticache = var.redis_backend == "elasticache"
  redis_auth  = var.redis_auth_token == null ? "" : ":${var.redis_auth_token}@"
  redis_url = (local.elasticache
    ? "rediss://${local.redis_auth}${one(aws_elasticache_replication_group.redis[*].primary_endpoint_address)}:6379/0"
    : "redis://${local.redis_auth}${one(aws_instance.redis[*].private_ip)}:6379/0"
  )
}

resource "aws_elasticache_subnet_group" "redis" {
  count       = local.elasticache ? 1 : 0
  name        = "${var.name_prefix}-redis"
  description = "Tide Redis"
  subnet_ids  = var.subnet_ids
  tags        = local.tags
}

resource "aws_elasticache_parameter_group" "redis" {
  count       = local.elasticache ? 1 : 0
  name        = "${var.name_prefix}-redis"
  family      = var.redis_parameter_group_family
  description = "Tide: never evict job records or queues"
  tags        = local.tags

  parameter {
    name  = "maxmemory-policy"
    value = "noeviction"
  }
}

resource "aws_elasticache_replication_group" "redis" {
  count                      = local.elasticache ? 1 : 0
  replication_group_id       = "${var.name_prefix}-redis"
  description                = "Tide job records and queues"
  engine                     = "redis"
  engine_version             = var.redis_engine_version
  node_type                  = var.redis_node_type
  port                       = 6379
  num_cache_clusters         = 1 + var.redis_replicas
  automatic_failover_enabled = var.redis_replicas > 0
  multi_az_enabled           = var.redis_replicas > 0
  parameter_group_name       = aws_elasticache_parameter_group.redis[0].name
  subnet_group_name          = aws_elasticache_subnet_group.redis[0].name
  security_group_ids         = [aws_security_group.redis.id]
  at_rest_encryption_enabled = true
  transit_encryption_enabled = true
  auth_token                 = var.redis_auth_token
  snapshot_retention_limit   = var.redis_snapshot_retention_days
  tags                       = local.tags
}

resource "aws_launch_template" "redis" {
  count                  = local.elasticache ? 0 : 1
  name                   = "${var.name_prefix}-redis"
  description            = "Tide Redis host (AOF)"
  image_id               = var.ami_id
  instance_type          = var.redis_instance_type
  key_name               = var.key_name
  vpc_security_group_ids = [aws_security_group.redis.id]
  update_default_version = true
  user_data = base64encode(templatefile("${path.module}/templates/redis.sh.tftpl", {
    auth_token = var.redis_auth_token == null ? "" : var.redis_auth_token
  }))

  iam_instance_profile {
    arn = aws_iam_instance_profile.host["redis"].arn
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = var.root_device_name
    ebs {
      volume_size           = var.redis_volume_size_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = merge(local.tags, { Name = "${var.name_prefix}-redis", Role = "redis" })
  }

  tags = local.tags
}

resource "aws_instance" "redis" {
  count     = local.elasticache ? 0 : 1
  subnet_id = var.subnet_ids[0]

  launch_template {
    id      = aws_launch_template.redis[0].id
    version = aws_launch_template.redis[0].latest_version
  }

  tags = merge(local.tags, { Name = "${var.name_prefix}-redis", Role = "redis" })

  lifecycle {
    # Replacing this host loses its AOF: change it deliberately (terraform apply -replace).
    ignore_changes = [launch_template]
  }
}
