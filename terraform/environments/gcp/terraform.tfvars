# Example: two GCP regions, control plane in us-central1. Prices are USD per
# instance-hour, illustrative list prices at the time of writing; refresh them from
# the Cloud Billing Catalog API before relying on cost decisions.

project_id       = "nimbus-prod-123456"
name             = "nimbus"
cluster_name     = "nimbus-prod"
image            = "us-docker.pkg.dev/nimbus-prod-123456/nimbus/nimbus:0.1.0"
domain           = "nimbus.example.com"
dns_managed_zone = "nimbus-example-com"

control_plane = {
  region = "us-central1"
}

regions = {
  "us-central1" = {
    nodes_cidr    = "10.30.0.0/18"
    services_cidr = "10.30.64.0/24"
    zones         = ["us-central1-a", "us-central1-b", "us-central1-c"]
    instance_types = [
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
    ]
  }
  "europe-west4" = {
    nodes_cidr    = "10.40.0.0/18"
    services_cidr = "10.40.64.0/24"
    zones         = ["europe-west4-a", "europe-west4-b", "europe-west4-c"]
    instance_types = [
      {
        name            = "a2-ultragpu-1g"
        gpu_type        = "a100"
        gpu_count       = 1
        gpu_memory_gb   = 80
        vcpus           = 12
        memory_gb       = 170
        on_demand_price = 5.5813
        spot_price      = null
      },
      {
        name            = "g2-standard-8"
        gpu_type        = "l4"
        gpu_count       = 1
        gpu_memory_gb   = 24
        vcpus           = 8
        memory_gb       = 32
        on_demand_price = 0.9389
        spot_price      = 0.3757
      },
    ]
  }
}

labels = {
  owner = "platform-team"
}
