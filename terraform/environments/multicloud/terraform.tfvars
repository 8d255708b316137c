# Example: control plane in AWS us-east-1; edges and GPU nodes in two AWS and two GCP
# regions. Prices are USD per instance-hour, illustrative list prices at the time of
# writing; refresh them from each cloud's pricing API before relying on cost decisions.

name         = "nimbus"
cluster_name = "nimbus-global"
image        = "123456789012.dkr.ecr.us-east-1.amazonaws.com/nimbus:0.1.0"
gcp_image    = "us-docker.pkg.dev/nimbus-global-123456/nimbus/nimbus:0.1.0"
domain       = "nimbus.example.com"

aws_primary = {
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
  ]
}

aws_secondary = {
  region          = "eu-west-1"
  cidr_block      = "10.20.0.0/16"
  zones           = ["eu-west-1a", "eu-west-1b"]
  edge_short_name = "nimbus-edge-euw1"
  instance_types = [
    {
      name            = "g5.12xlarge"
      gpu_type        = "a10g"
      gpu_count       = 4
      gpu_memory_gb   = 24
      vcpus           = 48
      memory_gb       = 192
      on_demand_price = 6.34
      spot_price      = 2.55
    },
  ]
}

gcp_project_id = "nimbus-global-123456"
gcp_vpn_region = "us-central1"

gcp_regions = {
  "us-central1" = {
    nodes_cidr     = "10.30.0.0/18"
    services_cidr  = "10.30.64.0/24"
    zones          = ["us-central1-a", "us-central1-b", "us-central1-c"]
    latency_region = "us-east-2"
    instance_types = [
      {
        name            = "a3-highgpu-8g"
        gpu_type        = "h100"
        gpu_count       = 8
        gpu_memory_gb   = 80
        vcpus           = 208
        memory_gb       = 1872
        on_demand_price = 88.2522
        spot_price      = 29.52
        zones           = ["us-central1-a", "us-central1-c"]
      },
      {
        name            = "g2-standard-8"
        gpu_type        = "l4"
        gpu_count       = 1
        gpu_memory_gb   = 24
        vcpus           = 8
        memory_gb       = 32
        on_demand_price = 0.8536
        spot_price      = 0.3415
      },
    ]
  }
  "asia-southeast1" = {
    nodes_cidr     = "10.50.0.0/18"
    services_cidr  = "10.50.64.0/24"
    zones          = ["asia-southeast1-a", "asia-southeast1-b", "asia-southeast1-c"]
    latency_region = "ap-southeast-1"
    instance_types = [
      {
        name            = "g2-standard-8"
        gpu_type        = "l4"
        gpu_count       = 1
        gpu_memory_gb   = 24
        vcpus           = 8
        memory_gb       = 32
        on_demand_price = 1.0027
        spot_price      = 0.4011
      },
    ]
  }
}

tags = {
  owner = "platform-team"
}
