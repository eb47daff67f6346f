# The heterogeneous fleet of fleet.example.toml: a control plane and one Auto Scaling group
# per pool (a small spot pool for short jobs, a big on-demand pool for medium and long
# ones). Feed it with `tide infra tfvars --fleet fleet.toml -o terraform.tfvars.json`.
# Every host installs the operator's Tide wheel, uploaded here and checked by its SHA-256.

data "aws_vpc" "default" {
  count   = length(var.subnet_ids) == 0 ? 1 : 0
  default = true
}

data "aws_subnets" "default" {
  count = length(var.subnet_ids) == 0 ? 1 : 0
  filter {
    name   = "vpc-id"
    values = [data.aws_vpc.default[0].id]
  }
}

locals {
  subnet_ids = length(var.subnet_ids) > 0 ? var.subnet_ids : sort(data.aws_subnets.default[0].ids)
}

data "aws_subnet" "first" {
  id = local.subnet_ids[0]
}

module "control_plane" {
  source = "../../modules/control_plane"

  name_prefix           = var.name_prefix
  vpc_id                = data.aws_subnet.first.vpc_id
  subnet_ids            = local.subnet_ids
  ami_id                = var.ami_id
  key_name              = var.key_name
  root_device_name      = var.root_device_name
  tide_wheel_s3_uri     = local.tide_wheel_s3_uri
  tide_wheel_sha256     = var.tide_wheel_sha256
  fleet_toml            = var.fleet_toml
  cloudwatch_namespace  = var.cloudwatch_namespace
  environment           = var.environment
  env_ssm_parameter     = var.env_ssm_parameter
  gateway_count         = var.gateway_count
  gateway_port          = var.gateway_port
  gateway_ingress_cidrs = var.gateway_ingress_cidrs
  redis_backend         = var.redis_backend
  redis_replicas        = var.redis_replicas
  redis_instance_type   = var.redis_instance_type
  redis_volume_size_gb  = var.redis_volume_size_gb
  bucket_name           = var.bucket_name
  bucket_kms_key_arn    = var.bucket_kms_key_arn
  bucket_force_destroy  = var.bucket_force_destroy

  noncurrent_version_days = var.noncurrent_version_days
}

# The wheel, under its hash in the files bucket: a new build is a new object, uploaded before
# the launch templates that name it change and removed only after them.
resource "aws_s3_object" "tide_wheel" {
  bucket      = module.control_plane.bucket_name
  key         = "releases/${var.tide_wheel_sha256}/${basename(var.tide_wheel)}"
  source      = var.tide_wheel
  source_hash = var.tide_wheel_sha256

  lifecycle {
    create_before_destroy = true

    precondition {
      condition     = filesha256(var.tide_wheel) == var.tide_wheel_sha256
      error_message = "tide_wheel: ${var.tide_wheel} is not the build `tide infra tfvars` hashed (tide_wheel_sha256); run it again."
    }
  }
}

locals {
  tide_wheel_s3_uri = "s3://${aws_s3_object.tide_wheel.bucket}/${aws_s3_object.tide_wheel.key}"
}

module "pool" {
  source   = "../../modules/worker_pool"
  for_each = var.pools

  name_prefix                 = var.name_prefix
  pool_name                   = each.key
  buckets                     = each.value.buckets
  instance_types              = each.value.instance_types
  min_size                    = each.value.min_size
  max_size                    = each.value.max_size
  spot                        = each.value.spot
  on_demand_base              = each.value.on_demand_base
  warm_pool_size              = each.value.warm_pool_size
  drain_timeout_s             = each.value.drain_timeout_s
  model                       = each.value.model
  worker_args                 = each.value.worker_args
  gpus_per_worker             = each.value.gpus_per_worker
  target_tracking             = each.value.target_tracking
  target_backlog_per_instance = each.value.target_backlog_per_instance

  ami_id               = var.ami_id
  subnet_ids           = local.subnet_ids
  security_group_ids   = [module.control_plane.worker_security_group_id]
  redis_url            = module.control_plane.redis_url
  model_bucket_arns    = [module.control_plane.bucket_arn]
  tide_wheel_s3_uri    = local.tide_wheel_s3_uri
  tide_wheel_sha256    = var.tide_wheel_sha256
  cloudwatch_namespace = var.cloudwatch_namespace
  environment          = var.environment
  env_ssm_parameter    = var.env_ssm_parameter
  key_name             = var.key_name
  root_device_name     = var.root_device_name
  root_volume_size_gb  = var.worker_root_volume_gb
  tags                 = { Device = each.value.device }

  spot_allocation_strategy = var.spot_allocation_strategy
}
