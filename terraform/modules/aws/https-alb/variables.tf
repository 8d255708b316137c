variable "name" {
  type        = string
  description = "Name prefix of the load balancer and its companions (at most 20 characters)."

  validation {
    condition     = length(var.name) <= 20
    error_message = "ALB and target group names are limited to 32 characters; keep the prefix at most 20."
  }
}

variable "vpc_id" {
  type        = string
  description = "VPC the load balancer and its targets live in."
}

variable "vpc_cidr" {
  type        = string
  description = "CIDR of the VPC; the load balancer sends traffic to targets only inside it."
}

variable "public_subnet_ids" {
  type        = list(string)
  description = "Public subnets (two zones or more) the load balancer is placed in."
}

variable "target_port" {
  type        = number
  description = "Container port that receives the forwarded traffic."
}

variable "health_check_path" {
  type        = string
  description = "HTTP path the target group probes; it must answer 200 when the service is ready."
}

variable "domain_name" {
  type        = string
  description = "Fully qualified name the load balancer serves, e.g. api.us-east-1.example.com; it gets an ACM certificate and an alias record."
}

variable "subject_alternative_names" {
  type        = list(string)
  description = "Further names the certificate covers, e.g. the latency-routed global API name an edge also answers to."
  default     = []
}

variable "zone_id" {
  type        = string
  description = "Route 53 hosted zone that holds domain_name (certificate validation and alias record)."
}

variable "idle_timeout" {
  type        = number
  description = "Seconds a connection may stay idle; long enough for slow token streams."
  default     = 300
}

variable "log_bucket_id" {
  type        = string
  description = "Regional log bucket for ALB access logs."
}

variable "log_prefix" {
  type        = string
  description = "Key prefix in the log bucket for this load balancer's access logs."
  default     = "alb"
}

variable "kms_key_arn" {
  type        = string
  description = "ARN of the regional KMS key that encrypts the WAF log group."
}

variable "log_retention_days" {
  type        = number
  description = "Days WAF logs are kept."
  default     = 365
}

variable "rate_limit_per_ip" {
  type        = number
  description = "Requests a single client IP may send in 5 minutes before WAF blocks it (coarse abuse guard; tenant limits live in the edge)."
  default     = 20000
}

variable "deletion_protection" {
  type        = bool
  description = "Refuse to delete the load balancer until this is turned off."
  default     = true
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
