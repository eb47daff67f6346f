output "redis_url" {
  description = "REDIS_URL for every Tide process (includes the auth token when one is set)."
  value       = local.redis_url
  sensitive   = true
}

output "redis_backend" {
  description = "Which Redis was created: elasticache or instance."
  value       = var.redis_backend
}

output "bucket_name" {
  description = "S3 bucket for batch files (TIDE_STORAGE_URL = s3://<bucket>/files) and models."
  value       = aws_s3_bucket.files.bucket
}

output "bucket_arn" {
  description = "ARN of the bucket (give it to the worker pools' model_bucket_arns)."
  value       = aws_s3_bucket.files.arn
}

output "worker_security_group_id" {
  description = "Security group for worker instances: it may reach Redis."
  value       = aws_security_group.workers.id
}

output "gateway_security_group_id" {
  description = "Security group of the gateway hosts (attach a load balancer's rule to it)."
  value       = aws_security_group.gateway.id
}

output "gateway_private_ips" {
  description = "Private IPs of the gateway hosts."
  value       = aws_instance.gateway[*].private_ip
}

output "gateway_urls" {
  description = "Base URLs of the gateways (public IP when they have one)."
  value       = [for g in aws_instance.gateway : "http://${coalesce(g.public_ip, g.private_ip)}:${var.gateway_port}"]
}

output "controller_instance_id" {
  description = "Instance id of the controller host."
  value       = aws_instance.controller.id
}

output "controller_security_group_id" {
  description = "Security group of the controller host (add a rule to scrape its metrics)."
  value       = aws_security_group.controller.id
}
