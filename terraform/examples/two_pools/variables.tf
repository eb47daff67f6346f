# Written by `tide infra tfvars` from fleet.toml (terraform.tfvars.json) ----------------

variable "region" {
  description = "AWS region ([aws] region)."
  type        = string
}

variable "name_prefix" {
  description = "Prefix of every name ([aws] name_prefix); ASGs are <name_prefix>-<pool>."
  type        = string
}

variable "ami_id" {
  description = "AMI of every host ([aws] ami_id): NVIDIA drivers and Python 3.11+."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets ([aws] subnet_ids); empty uses the default VPC's subnets."
  type        = list(string)
}

variable "cloudwatch_namespace" {
  description = "CloudWatch namespace of Tide's metrics ([aws] cloudwatch_namespace)."
  type        = string
}

variable "tide_wheel" {
  description = "The Tide wheel on this machine ([aws] tide_wheel, as an absolute path): uploaded to the files bucket; every host installs it."
  type        = string

  validation {
    condition     = endswith(var.tide_wheel, ".whl")
    error_message = "tide_wheel: the path of a .whl file (build it with `pip wheel --no-deps -w dist .`)."
  }
}

variable "tide_wheel_sha256" {
  description = "SHA-256 of tide_wheel, as `tide infra tfvars` computed it; hosts refuse a download that differs."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-f]{64}$", var.tide_wheel_sha256))
    error_message = "tide_wheel_sha256: 64 lowercase hexadecimal digits."
  }
}

variable "fleet_toml" {
  description = "The fleet file itself, for the controller host."
  type        = string
}

variable "pools" {
  description = "Worker pools by name, exactly as `tide infra tfvars` renders them from [pools.*]."
  type = map(object({
    buckets                     = list(string)
    device                      = string
    instance_types              = list(string)
    min_size                    = number
    max_size                    = number
    spot                        = bool
    on_demand_base              = number
    warm_pool_size              = number
    drain_timeout_s             = number
    model                       = string
    worker_args                 = list(string)
    gpus_per_worker             = number
    target_tracking             = bool
    target_backlog_per_instance = number
  }))

  validation {
    condition     = length(var.pools) > 0
    error_message = "pools: declare at least one pool."
  }
}

# Deployment choices (not in fleet.toml) ------------------------------------------------

variable "redis_backend" {
  description = "\"elasticache\" (replication group with a replica; no AOF) or \"instance\" (Redis with AOF on an EC2 host)."
  type        = string
  default     = "elasticache"
}

variable "redis_replicas" {
  description = "ElastiCache read replicas (>= 1: automatic failover and Multi-AZ)."
  type        = number
  default     = 1
}

variable "redis_instance_type" {
  description = "EC2 instance type of the Redis host (redis_backend = \"instance\")."
  type        = string
  default     = "r7i.large"
}

variable "redis_volume_size_gb" {
  description = "Root volume of the Redis host in GiB (holds the AOF)."
  type        = number
  default     = 50
}

variable "gateway_count" {
  description = "Gateway hosts (stateless; spread across the subnets)."
  type        = number
  default     = 1
}

variable "gateway_port" {
  description = "Port the gateway listens on."
  type        = number
  default     = 8000
}

variable "gateway_ingress_cidrs" {
  description = "CIDR blocks that may reach the gateway; empty: none from outside the VPC's security groups."
  type        = list(string)
  default     = []
}

variable "key_name" {
  description = "EC2 key pair of every host for SSH; null for none (use SSM Session Manager)."
  type        = string
  default     = null
}

variable "root_device_name" {
  description = "The AMI's root device name (/dev/sda1 on Ubuntu AMIs, /dev/xvda on Amazon Linux)."
  type        = string
  default     = "/dev/sda1"
}

variable "spot_allocation_strategy" {
  description = "Spot allocation strategy of the pools' mixed instances policies."
  type        = string
  default     = "capacity-optimized"
}

variable "environment" {
  description = "Extra TIDE_* settings for every host (not secrets: see env_ssm_parameter)."
  type        = map(string)
  default     = {}
}

variable "env_ssm_parameter" {
  description = "SSM SecureString parameter with KEY=VALUE secret settings (API keys, webhook secrets); \"\" for none."
  type        = string
  default     = ""
}

variable "bucket_name" {
  description = "Name of the files bucket; \"\" names it <name_prefix>-<account id>-<region>."
  type        = string
  default     = ""
}

variable "bucket_kms_key_arn" {
  description = "KMS key for the files bucket's default encryption; null uses SSE-S3."
  type        = string
  default     = null
}

variable "bucket_force_destroy" {
  description = "Let destroy delete the files bucket with objects in it (tests only)."
  type        = bool
  default     = false
}

variable "noncurrent_version_days" {
  description = "Days the files bucket keeps a file's overwritten versions; 0 = no lifecycle rule (the moto apply test)."
  type        = number
  default     = 30
}

variable "worker_root_volume_gb" {
  description = "Root volume of each worker in GiB (Tide, torch, the model)."
  type        = number
  default     = 200
}

# Provider overrides for tests (moto); leave unset for AWS ------------------------------

variable "aws_endpoint_url" {
  description = "One endpoint for every AWS service (a moto server in tests); null for AWS itself."
  type        = string
  default     = null
}

variable "aws_skip_checks" {
  description = "Skip the provider's credential and EC2 metadata checks (fake credentials in tests)."
  type        = bool
  default     = false
}
