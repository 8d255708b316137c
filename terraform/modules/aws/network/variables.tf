variable "name" {
  type        = string
  description = "Name prefix for every resource."
}

variable "cidr_block" {
  type        = string
  description = "IPv4 CIDR of the VPC, e.g. 10.10.0.0/16. Keep it distinct per region so VPCs can be peered."
}

variable "zones" {
  type        = list(string)
  description = "Availability zones to spread subnets over; GPU nodes launch into the private subnet of each."

  validation {
    condition     = length(var.zones) >= 2
    error_message = "At least two zones are needed (RDS Multi-AZ and the ALB span two)."
  }
}

variable "single_nat_gateway" {
  type        = bool
  description = "One NAT gateway for all zones (cheaper) instead of one per zone (survives a zone outage)."
  default     = false
}

variable "interface_endpoints" {
  type        = list(string)
  description = "AWS services reached through interface VPC endpoints instead of the NAT, e.g. [\"ecr.api\", \"logs\"]."
  default     = ["ecr.api", "ecr.dkr", "logs", "secretsmanager", "sts", "ec2"]
}

variable "kms_key_arn" {
  type        = string
  description = "ARN of the regional KMS key that encrypts the flow-log group."
}

variable "flow_log_retention_days" {
  type        = number
  description = "Days VPC flow logs are kept."
  default     = 365
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
