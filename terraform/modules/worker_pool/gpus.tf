# GPUs per instance type, so a pool whose workers take several GPUs (gpus_per_worker, one
# worker per instance) only launches instance types that hold one. Counts from AWS's
# accelerated-computing instance types (https://aws.amazon.com/ec2/instance-types/ and
# https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html); Tide's own table is
# infra/fleet/instance_gpus.py, and tests/infra/fleet/test_instance_gpus.py keeps the two equal.

locals {
  instance_gpus = {
    # g4dn: NVIDIA T4
    "g4dn.xlarge"   = 1
    "g4dn.2xlarge"  = 1
    "g4dn.4xlarge"  = 1
    "g4dn.8xlarge"  = 1
    "g4dn.16xlarge" = 1
    "g4dn.12xlarge" = 4
    "g4dn.metal"    = 8
    # g5: NVIDIA A10G
    "g5.xlarge"   = 1
    "g5.2xlarge"  = 1
    "g5.4xlarge"  = 1
    "g5.8xlarge"  = 1
    "g5.16xlarge" = 1
    "g5.12xlarge" = 4
    "g5.24xlarge" = 4
    "g5.48xlarge" = 8
    # g6 and gr6: NVIDIA L4
    "g6.xlarge"   = 1
    "g6.2xlarge"  = 1
    "g6.4xlarge"  = 1
    "g6.8xlarge"  = 1
    "g6.16xlarge" = 1
    "g6.12xlarge" = 4
    "g6.24xlarge" = 4
    "g6.48xlarge" = 8
    "gr6.4xlarge" = 1
    "gr6.8xlarge" = 1
    # g6e: NVIDIA L40S
    "g6e.xlarge"   = 1
    "g6e.2xlarge"  = 1
    "g6e.4xlarge"  = 1
    "g6e.8xlarge"  = 1
    "g6e.16xlarge" = 1
    "g6e.12xlarge" = 4
    "g6e.24xlarge" = 4
    "g6e.48xlarge" = 8
    # p3 and p3dn: NVIDIA V100
    "p3.2xlarge"    = 1
    "p3.8xlarge"    = 4
    "p3.16xlarge"   = 8
    "p3dn.24xlarge" = 8
    # p4d, p4de: NVIDIA A100 40 GB, 80 GB; p5: H100; p5e, p5en: H200; p6-b200: B200
    "p4d.24xlarge"     = 8
    "p4de.24xlarge"    = 8
    "p5.48xlarge"      = 8
    "p5e.48xlarge"     = 8
    "p5en.48xlarge"    = 8
    "p6-b200.48xlarge" = 8
  }

  # The pool's instance types that cannot hold one worker: fewer GPUs than it takes or, for
  # a worker of several GPUs, a type whose GPU count is not in the table.
  short_of_gpus = [
    for t in var.instance_types : (
      lookup(local.instance_gpus, t, 0) == 0 ? "${t} (GPU count unknown)" :
      "${t} (${local.instance_gpus[t]} GPU${local.instance_gpus[t] == 1 ? "" : "s"})"
    ) if var.gpus_per_worker > 1 && lookup(local.instance_gpus, t, 0) < var.gpus_per_worker
  ]
}
