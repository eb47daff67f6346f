terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.60, < 6.0"
    }
  }
}

provider "aws" {
  region = var.region

  # Off by default. Tests aim the provider at a local moto server with these.
  skip_credentials_validation = var.aws_skip_checks
  skip_metadata_api_check     = var.aws_skip_checks
  s3_use_path_style           = var.aws_endpoint_url != null

  endpoints {
    autoscaling = var.aws_endpoint_url
    cloudwatch  = var.aws_endpoint_url
    ec2         = var.aws_endpoint_url
    elasticache = var.aws_endpoint_url
    iam         = var.aws_endpoint_url
    s3          = var.aws_endpoint_url
    ssm         = var.aws_endpoint_url
    sts         = var.aws_endpoint_url
  }

  default_tags {
    tags = { Project = "tide", Fleet = var.name_prefix }
  }
}
