variable "project_id" {
  type        = string
  description = "GCP project of the load balancer."
}

variable "name" {
  type        = string
  description = "Name prefix of the load balancer's parts."
}

variable "api_domain_name" {
  type        = string
  description = "Name tenants call, e.g. api.nimbus.example.com; the anycast address sends each client to its nearest edge."
}

variable "edges" {
  type = map(object({
    domain_name = string
    neg_id      = string
  }))
  description = "Regional edges by region: their own name (pinned to that region) and serverless network endpoint group."
}

variable "control_plane" {
  type = object({
    domain_name = string
    neg_id      = string
  })
  description = "Control plane API host and its network endpoint group; null when the control plane runs elsewhere (multicloud)."
  default     = null
}

variable "rate_limit_per_ip" {
  type        = number
  description = "Requests per minute a single client IP may send before Cloud Armor throttles it (coarse abuse guard; tenant limits live in the edge)."
  default     = 6000
}

variable "dns_managed_zone" {
  type        = string
  description = "Cloud DNS managed zone that gets an A record per hostname; null when DNS lives elsewhere (Route 53 in multicloud)."
  default     = null
}
