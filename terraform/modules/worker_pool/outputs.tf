output "asg_name" {
  description = "Auto Scaling group name (\"<name_prefix>-<pool_name>\"): what the controller scales."
  value       = aws_autoscaling_group.pool.name
}

output "asg_arn" {
  description = "Auto Scaling group ARN."
  value       = aws_autoscaling_group.pool.arn
}

output "launch_template_id" {
  description = "Launch template of the pool's instances."
  value       = aws_launch_template.worker.id
}

output "iam_role_name" {
  description = "IAM role of the workers (attach more policies to it if they need more)."
  value       = aws_iam_role.worker.name
}

output "lifecycle_hook_name" {
  description = "Termination lifecycle hook the instances complete after draining."
  value       = aws_autoscaling_lifecycle_hook.drain.name
}

output "uses_mixed_instances" {
  description = "Whether the group uses a mixed instances policy (spot, or several instance types)."
  value       = local.mixed
}
