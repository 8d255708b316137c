locals {
  # Network tags the firewall keys on; Cloud Run services carry them on their
  # Direct VPC egress interfaces, GPU nodes through the instance template.
  tags = {
    gpu           = "${var.name}-gpu"
    edge          = "${var.name}-edge"
    control_plane = "${var.name}-control-plane"
  }
}

# One global VPC: GCP routes between its regional subnets natively, so every edge
# reaches GPU nodes in every region without peering.
resource "google_compute_network" "this" {
  project                 = var.project_id
  name                    = var.name
  auto_create_subnetworks = false
  routing_mode            = "GLOBAL"
}

resource "google_compute_subnetwork" "nodes" {
  for_each = var.regions

  project                  = var.project_id
  name                     = "${var.name}-nodes-${each.key}"
  region                   = each.key
  network                  = google_compute_network.this.id
  ip_cidr_range            = each.value.nodes_cidr
  private_ip_google_access = true

  log_config {
    aggregation_interval = "INTERVAL_5_SEC"
    flow_sampling        = 0.5
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_subnetwork" "services" {
  for_each = var.regions

  project                  = var.project_id
  name                     = "${var.name}-services-${each.key}"
  region                   = each.key
  network                  = google_compute_network.this.id
  ip_cidr_range            = each.value.services_cidr
  private_ip_google_access = true

  log_config {
    aggregation_interval = "INTERVAL_5_SEC"
    flow_sampling        = 0.5
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_router" "this" {
  for_each = var.regions

  project = var.project_id
  name    = "${var.name}-${each.key}"
  region  = each.key
  network = google_compute_network.this.id
}

# GPU nodes have no public address; they reach model hubs through Cloud NAT.
resource "google_compute_router_nat" "this" {
  for_each = var.regions

  project                            = var.project_id
  name                               = "${var.name}-${each.key}"
  region                             = each.key
  router                             = google_compute_router.this[each.key].name
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

# Private services access: Cloud SQL and Memorystore get addresses inside the VPC.
resource "google_compute_global_address" "private_services" {
  project       = var.project_id
  name          = "${var.name}-private-services"
  purpose       = "VPC_PEERING"
  address_type  = "INTERNAL"
  address       = split("/", var.private_services_cidr)[0]
  prefix_length = tonumber(split("/", var.private_services_cidr)[1])
  network       = google_compute_network.this.id
}

resource "google_service_networking_connection" "private_services" {
  network                 = google_compute_network.this.id
  service                 = "servicenetworking.googleapis.com"
  reserved_peering_ranges = [google_compute_global_address.private_services.name]
}

resource "google_compute_firewall" "to_gpu_nodes" {
  project     = var.project_id
  name        = "${var.name}-to-gpu-nodes"
  network     = google_compute_network.this.id
  description = "Engines and node agent: reachable from edges and the control plane only"
  direction   = "INGRESS"
  source_tags = [local.tags.edge, local.tags.control_plane]
  target_tags = [local.tags.gpu]

  allow {
    protocol = "tcp"
    ports    = ["${var.engine_ports.from}-${var.engine_ports.to}", tostring(var.agent_port)]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_firewall" "peers_to_gpu_nodes" {
  count = length(var.peer_cidrs) > 0 ? 1 : 0

  project       = var.project_id
  name          = "${var.name}-peers-to-gpu-nodes"
  network       = google_compute_network.this.id
  description   = "Engines and node agent: reachable from the other cloud's edges and control plane over VPN"
  direction     = "INGRESS"
  source_ranges = var.peer_cidrs
  target_tags   = [local.tags.gpu]

  allow {
    protocol = "tcp"
    ports    = ["${var.engine_ports.from}-${var.engine_ports.to}", tostring(var.agent_port)]
  }

  log_config {
    metadata = "INCLUDE_ALL_METADATA"
  }
}
