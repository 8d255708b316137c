variable "project_id" {
  type        = string
  description = "GCP project of the network."
}

variable "name" {
  type        = string
  description = "Name of the VPC network and prefix of its companions."
}

variable "regions" {
  type = map(object({
    nodes_cidr    = string
    services_cidr = string
  }))
  description = "Regions by name: the subnet for GPU nodes and the subnet for Cloud Run egress (edges, control plane) in each."
}

variable "private_services_cidr" {
  type        = string
  description = "Range reserved for private services access (Cloud SQL, Memorystore), e.g. 10.200.0.0/16."
}

variable "peer_cidrs" {
  type        = list(string)
  description = "CIDRs of another cloud's edges and control plane, connected over VPN (multicloud), that may reach GPU nodes."
  default     = []
}

variable "engine_ports" {
  type = object({
    from = number
    to   = number
  })
  description = "Port range of the engines on GPU nodes."
  default     = { from = 30000, to = 30015 }
}

variable "agent_port" {
  type        = number
  description = "Port of the node agent on GPU nodes."
  default     = 8479
}
