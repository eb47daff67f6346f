output "asg_names" {
  description = "Auto Scaling group of each pool (what the controller scales)."
  value       = { for name, pool in module.pool : name => pool.asg_name }
}

output "gateway_urls" {
  description = "Base URLs of the gateways."
  value       = module.control_plane.gateway_urls
}

output "bucket_name" {
  description = "S3 bucket for batch files and models."
  value       = module.control_plane.bucket_name
}

output "redis_url" {
  description = "REDIS_URL of the fleet."
  value       = module.control_plane.redis_url
  sensitive   = true
}

output "pools" {
  description = "The pools as Terraform read them (tests compare this with the rendered tfvars)."
  value       = var.pools
}
