# Identity and network

variable "name_prefix" {
  description = "Prefix of every name (the fleet's [aws] name_prefix)."
  type        = string
  default     = "tide"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.name_prefix))
    error_message = "name_prefix: 1-20 characters, lowercase letters, digits and '-', starting with a letter."
  }
}

variable "vpc_id" {
  description = "VPC of the fleet."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets for the hosts and the Redis subnet group (two zones or more for a Multi-AZ replica)."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) > 0
    error_message = "subnet_ids: at least one subnet."
  }
}

variable "ami_id" {
  description = "AMI of the gateway, controller (and Redis) hosts: Linux with Python 3.11+; no GPU needed."
  type        = string

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id: an AMI id like ami-0123456789abcdef0."
  }
}

variable "key_name" {
  description = "EC2 key pair for SSH; null for none (use SSM Session Manager)."
  type        = string
  default     = null
}

variable "root_device_name" {
  description = "The AMI's root device name (/dev/sda1 on Ubuntu AMIs, /dev/xvda on Amazon Linux)."
  type        = string
  default     = "/dev/sda1"
}

# Tide on the hosts

variable "tide_wheel_s3_uri" {
  description = "s3://BUCKET/KEY of the Tide wheel to install (the example uploads the operator's build there). Each instance downloads it with its role, checks it against tide_wheel_sha256 and pip-installs that file."
  type        = string

  validation {
    condition     = can(regex("^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[A-Za-z0-9_.+=/-]*[A-Za-z0-9_.+-][.]whl$", var.tide_wheel_s3_uri))
    error_message = "tide_wheel_s3_uri: s3://BUCKET/KEY of a .whl file, the key of letters, digits and _ . + = - / only."
  }
}

variable "tide_wheel_sha256" {
  description = "SHA-256 of the wheel (`tide infra tfvars` computes it); an instance whose download differs stops its bootstrap before installing anything."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-f]{64}$", var.tide_wheel_sha256))
    error_message = "tide_wheel_sha256: 64 lowercase hexadecimal digits."
  }
}

variable "python" {
  description = "Python 3.11+ interpreter on the AMI used to create Tide's virtualenv."
  type        = string
  default     = "python3"
}

variable "fleet_toml" {
  description = "Contents of fleet.toml for the controller (`tide infra tfvars` puts it in the tfvars)."
  type        = string

  validation {
    condition     = strcontains(var.fleet_toml, "[pools.")
    error_message = "fleet_toml: the text of a fleet.toml declaring at least one [pools.NAME] table."
  }
}

variable "environment" {
  description = "Extra environment for every Tide process (TIDE_* settings). Written into user data in the clear: put secrets (API keys, webhook secrets) in env_ssm_parameter instead."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.environment : can(regex("^[A-Z_][A-Z0-9_]*$", k)) && !strcontains(v, "'") && !strcontains(v, "\n")])
    error_message = "environment: keys are UPPER_SNAKE_CASE; values may not contain single quotes or newlines."
  }
}

variable "env_ssm_parameter" {
  description = "Name of an SSM SecureString parameter whose value (KEY=VALUE lines: TIDE_API_KEYS, TIDE_WEBHOOK_SECRETS, ...) is appended to the environment at boot; \"\" for none. The gateway refuses the development webhook secret in production, so set one here."
  type        = string
  default     = ""
}

variable "cloudwatch_namespace" {
  description = "CloudWatch namespace the controller publishes to (BacklogPerInstance, dimension Pool)."
  type        = string
  default     = "Tide"
}

# Gateway and controller hosts

variable "gateway_count" {
  description = "Gateway hosts (stateless; spread across the subnets)."
  type        = number
  default     = 1

  validation {
    condition     = var.gateway_count >= 0 && floor(var.gateway_count) == var.gateway_count
    error_message = "gateway_count: a whole number >= 0."
  }
}

variable "gateway_instance_type" {
  description = "Gateway instance type (the gateway counts tokens: CPU-bound)."
  type        = string
  default     = "c7i.large"
}

variable "gateway_port" {
  description = "Port the gateway listens on."
  type        = number
  default     = 8000

  validation {
    condition     = var.gateway_port >= 1 && var.gateway_port <= 65535
    error_message = "gateway_port: 1-65535."
  }
}

variable "gateway_ingress_cidrs" {
  description = "CIDR blocks that may reach the gateway port; empty (the default) opens it to nothing outside the VPC's security groups: put a load balancer in front or list your networks."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.gateway_ingress_cidrs : can(cidrhost(c, 0))])
    error_message = "gateway_ingress_cidrs: each entry must be a CIDR block such as 10.0.0.0/16."
  }
}

variable "associate_public_ip" {
  description = "Give the gateway hosts public IPs (needs a public subnet)."
  type        = bool
  default     = false
}

variable "controller_instance_type" {
  description = "Controller host instance type (runs tide controller, which also reaps leases and supervises batches, and the Celery webhook/batch worker)."
  type        = string
  default     = "t3.medium"
}

# Redis

variable "redis_backend" {
  description = "\"elasticache\": a replication group with a Multi-AZ replica (ElastiCache does not allow AOF on Redis OSS 2.8.22+); \"instance\": Redis on an EC2 host with AOF (appendfsync everysec) on an encrypted volume."
  type        = string
  default     = "elasticache"

  validation {
    condition     = contains(["elasticache", "instance"], var.redis_backend)
    error_message = "redis_backend: \"elasticache\" or \"instance\"."
  }
}

variable "redis_node_type" {
  description = "ElastiCache node type (not cache.t1/t2: no Multi-AZ)."
  type        = string
  default     = "cache.r7g.large"
}

variable "redis_engine_version" {
  description = "ElastiCache Redis OSS engine version."
  type        = string
  default     = "7.1"
}

variable "redis_parameter_group_family" {
  description = "Parameter group family matching redis_engine_version."
  type        = string
  default     = "redis7"
}

variable "redis_replicas" {
  description = "Read replicas in the replication group (>= 1 enables automatic failover and Multi-AZ)."
  type        = number
  default     = 1

  validation {
    condition     = var.redis_replicas >= 0 && var.redis_replicas <= 5 && floor(var.redis_replicas) == var.redis_replicas
    error_message = "redis_replicas: a whole number from 0 to 5."
  }
}

variable "redis_snapshot_retention_days" {
  description = "Daily ElastiCache snapshots kept (0 turns them off)."
  type        = number
  default     = 7
}

variable "redis_auth_token" {
  description = "Redis password (ElastiCache AUTH token, 16-128 characters, needs TLS; or requirepass on the instance). null for none."
  type        = string
  default     = null
  sensitive   = true

  validation {
    condition     = var.redis_auth_token == null || can(regex("^[A-Za-z0-9!&#$^<>-]{16,128}$", var.redis_auth_token))
    error_message = "redis_auth_token: 16-128 characters of letters, digits and ! & # $ ^ < > -."
  }
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

# Storage

variable "bucket_name" {
  description = "S3 bucket for batch files and models; \"\" names it <name_prefix>-<account id>-<region>."
  type        = string
  default     = ""
}

variable "bucket_force_destroy" {
  description = "Let `terraform destroy` delete a bucket that still holds objects (tests only)."
  type        = bool
  default     = false
}

variable "noncurrent_version_days" {
  description = "Days the bucket keeps a file's overwritten versions; the same lifecycle rule aborts multipart uploads left for 7 days. 0 = no lifecycle rule."
  type        = number
  default     = 30

  validation {
    condition     = var.noncurrent_version_days >= 0 && floor(var.noncurrent_version_days) == var.noncurrent_version_days
    error_message = "noncurrent_version_days must be a whole number of days, 0 or more (0 = no lifecycle rule)."
  }
}

variable "bucket_kms_key_arn" {
  description = "KMS key for the bucket's default encryption; null uses SSE-S3 (AES-256)."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags on every resource."
  type        = map(string)
  default     = {}
}
