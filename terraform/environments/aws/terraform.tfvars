# Example: two AWS regions, control plane in us-east-1. Prices are USD per
# instance-hour, illustrative list prices at the time of writing; refresh them from
# the AWS Price List API before relying on cost decisions.

name         = "nimbus"
cluster_name = "nimbus-prod"
image        = "123456789012.dkr.ecr.us-east-1.amazonaws.com/nimbus:0.1.0"
domain       = "nimbus.example.com"

primary = {
  region          = "us-east-1"
  cidr_block      = "10.10.0.0/16"
  zones           = ["us-east-1a", "us-east-1b", "us-east-1c"]
  edge_short_name = "nimbus-edge-use1"
  instance_types = [
    {
      name            = "g6e.12xlarge"
      gpu_type        = "l40s"
      gpu_count       = 4
      gpu_memory_gb   = 48
      vcpus           = 48
      memory_gb       = 384
      on_demand_price = 10.493
      spot_price      = 4.20
    },
    {
      name            = "p5.48xlarge"
      gpu_type        = "h100"
      gpu_count       = 8
      gpu_memory_gb   = 80
      vcpus           = 192
      memory_gb       = 2048
      on_demand_price = 55.04
      spot_price      = null
      zones           = ["us-east-1a", "us-east-1c"]
    },
    {
      name            = "g6.xlarge"
      gpu_type        = "l4"
      gpu_count       = 1
      gpu_memory_gb   = 24
      vcpus           = 4
      memory_gb       = 16
      on_demand_price = 0.8048
      spot_price      = 0.35
    },
  ]
}

secondary = {
  region          = "us-west-2"
  cidr_block      = "10.20.0.0/16"
  zones           = ["us-west-2a", "us-west-2b"]
  edge_short_name = "nimbus-edge-usw2"
  instance_types = [
    {
      name            = "g5.12xlarge"
      gpu_type        = "a10g"
      gpu_count       = 4
      gpu_memory_gb   = 24
      vcpus           = 48
      memory_gb       = 192
      on_demand_price = 5.672
      spot_price      = 2.30
    },
    {
      name            = "p4d.24xlarge"
      gpu_type        = "a100"
      gpu_count       = 8
      gpu_memory_gb   = 40
      vcpus           = 96
      memory_gb       = 1152
      on_demand_price = 21.958
      spot_price      = null
    },
  ]
}

control_plane = {
  api_count    = 2
  worker_count = 2
}

tags = {
  owner = "platform-team"
}
