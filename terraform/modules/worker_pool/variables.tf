# Identity

variable "name_prefix" {
  description = "Prefix of every name; the ASG is named \"<name_prefix>-<pool_name>\", which the controller's AWS actuator relies on."
  type        = string
  default     = "tide"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,19}$", var.name_prefix))
    error_message = "name_prefix: 1-20 characters, lowercase letters, digits and '-', starting with a letter."
  }
}

variable "pool_name" {
  description = "Pool name, as in fleet.toml ([pools.NAME]); tagged Pool on every instance."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,32}$", var.pool_name))
    error_message = "pool_name: 1-32 characters of letters, digits, '-' and '_'."
  }
}

variable "buckets" {
  description = "Length buckets this pool serves, in preference order (tide worker --buckets)."
  type        = list(string)

  validation {
    condition     = length(var.buckets) > 0 && alltrue([for b in var.buckets : contains(["short", "medium", "long"], b)])
    error_message = "buckets: at least one of short, medium, long."
  }
}

# What runs on the instances

variable "model" {
  description = "Model the workers serve: a path on the AMI, an s3:// URI (downloaded once per instance, before the worker starts), or \"\" for the TIDE_MODEL default."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^[A-Za-z0-9_.,:=/+@-]*$", var.model))
    error_message = "model: a path or s3:// URI of letters, digits and _ . , : = / + @ - (no spaces or quotes)."
  }
}

variable "worker_args" {
  description = "Extra `tide worker` flags, e.g. [\"--max-num-seqs\", \"128\"]."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.worker_args : can(regex("^[A-Za-z0-9_.,:=/+-]+$", a))])
    error_message = "worker_args: each argument may hold only letters, digits and _ . , : = / + - (they are written into a systemd unit unquoted)."
  }
}

variable "gpus_per_worker" {
  description = "GPUs each worker takes (fleet.toml gpus_per_worker): it runs as `tide worker --tensor-parallel-size N`, one worker per instance, so each instance type needs at least N GPUs (gpus.tf)."
  type        = number
  default     = 1

  validation {
    condition     = var.gpus_per_worker >= 1 && floor(var.gpus_per_worker) == var.gpus_per_worker
    error_message = "gpus_per_worker: a whole number >= 1."
  }
}

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

variable "redis_url" {
  description = "REDIS_URL every worker connects to (the control plane's redis_url output)."
  type        = string
  sensitive   = true
}

variable "environment" {
  description = "Extra environment for the worker (TIDE_* settings). Written into user data in the clear: put secrets in env_ssm_parameter instead."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.environment : can(regex("^[A-Z_][A-Z0-9_]*$", k)) && !strcontains(v, "'") && !strcontains(v, "\n")])
    error_message = "environment: keys are UPPER_SNAKE_CASE; values may not contain single quotes or newlines."
  }
}

variable "env_ssm_parameter" {
  description = "Name of an SSM SecureString parameter whose value (KEY=VALUE lines) is appended to the worker's environment at boot; \"\" for none."
  type        = string
  default     = ""
}

# Capacity

variable "instance_types" {
  description = "EC2 instance types, first preferred. More than one, or spot, uses a mixed instances policy."
  type        = list(string)

  validation {
    condition     = length(var.instance_types) > 0 && length(var.instance_types) <= 20
    error_message = "instance_types: between 1 and 20 EC2 instance types."
  }
}

variable "ami_id" {
  description = "AMI with NVIDIA drivers and Python 3.11+ (e.g. a Deep Learning AMI)."
  type        = string

  validation {
    condition     = can(regex("^ami-[0-9a-f]{8,17}$", var.ami_id))
    error_message = "ami_id: an AMI id like ami-0123456789abcdef0."
  }
}

variable "subnet_ids" {
  description = "Subnets the ASG launches into (spread across zones for spot capacity)."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) > 0
    error_message = "subnet_ids: at least one subnet."
  }
}

variable "security_group_ids" {
  description = "Security groups of the workers (the control plane's worker_security_group_id, which may reach Redis)."
  type        = list(string)
}

variable "min_size" {
  description = "ASG minimum; 0 lets the pool scale to zero."
  type        = number
  default     = 0

  validation {
    condition     = var.min_size >= 0 && floor(var.min_size) == var.min_size
    error_message = "min_size: a whole number >= 0."
  }
}

variable "max_size" {
  description = "ASG maximum: the most workers the controller may run."
  type        = number
  default     = 4

  validation {
    condition     = var.max_size >= 0 && floor(var.max_size) == var.max_size
    error_message = "max_size: a whole number >= 0."
  }
}

variable "spot" {
  description = "Run capacity-optimized spot above on_demand_base (through a mixed instances policy)."
  type        = bool
  default     = false
}

variable "on_demand_base" {
  description = "On-demand instances before any spot (with spot = true)."
  type        = number
  default     = 0

  validation {
    condition     = var.on_demand_base >= 0 && floor(var.on_demand_base) == var.on_demand_base
    error_message = "on_demand_base: a whole number >= 0."
  }
}

variable "spot_allocation_strategy" {
  description = "Spot allocation strategy of the mixed instances policy."
  type        = string
  default     = "capacity-optimized"

  validation {
    condition     = contains(["capacity-optimized", "capacity-optimized-prioritized", "price-capacity-optimized", "lowest-price"], var.spot_allocation_strategy)
    error_message = "spot_allocation_strategy: capacity-optimized, capacity-optimized-prioritized, price-capacity-optimized or lowest-price."
  }
}

variable "warm_pool_size" {
  description = "Stopped, pre-initialised instances (Tide installed, model downloaded) kept ready; 0 for none. Needs on-demand capacity of one instance type."
  type        = number
  default     = 0

  validation {
    condition     = var.warm_pool_size >= 0 && floor(var.warm_pool_size) == var.warm_pool_size
    error_message = "warm_pool_size: a whole number >= 0."
  }
}

variable "drain_timeout_s" {
  description = "Seconds a terminating worker may take to drain: the termination lifecycle hook's heartbeat timeout (AWS allows 30-7200)."
  type        = number
  default     = 300

  validation {
    condition     = var.drain_timeout_s >= 30 && var.drain_timeout_s <= 7200
    error_message = "drain_timeout_s: between 30 and 7200 seconds (the lifecycle hook's limits)."
  }
}

variable "target_tracking" {
  description = "Also attach a target-tracking policy on the controller's BacklogPerInstance metric (a backstop; the Tide controller normally owns capacity)."
  type        = bool
  default     = false
}

variable "target_backlog_per_instance" {
  description = "Target value of BacklogPerInstance (queued jobs of the pool's home buckets per instance, as the controller publishes it)."
  type        = number
  default     = 0
}

variable "cloudwatch_namespace" {
  description = "CloudWatch namespace of Tide's metrics (BacklogPerInstance, dimension Pool)."
  type        = string
  default     = "Tide"
}

# Instances

variable "root_volume_size_gb" {
  description = "Root volume size (gp3, encrypted) in GiB: room for Tide, torch and the model; 0 keeps the AMI's."
  type        = number
  default     = 200
}

variable "root_device_name" {
  description = "The AMI's root device name (/dev/sda1 on Ubuntu AMIs, /dev/xvda on Amazon Linux)."
  type        = string
  default     = "/dev/sda1"
}

variable "key_name" {
  description = "EC2 key pair for SSH; null for none (use SSM Session Manager)."
  type        = string
  default     = null
}

variable "model_bucket_arns" {
  description = "S3 bucket ARNs the workers may read (models and batch files); an s3:// model's own bucket is added."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags on every resource (Pool and Name are added)."
  type        = map(string)
  default     = {}
}
