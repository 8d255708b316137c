variable "name" {
  type        = string
  description = "Name prefix of the VPN parts in both clouds."
}

variable "aws" {
  type = object({
    vpc_id          = string
    route_table_ids = list(string)
    asn             = optional(number, 64512)
  })
  description = "AWS side: the VPC (the control plane's), the private route tables that learn GCP routes, and the virtual private gateway's BGP ASN."
}

variable "gcp" {
  type = object({
    project_id = string
    region     = string
    network_id = string
    asn        = optional(number, 64514)
  })
  description = "GCP side: project, the region of the HA VPN gateway, the VPC network and the Cloud Router's BGP ASN."
}

variable "tags" {
  type        = map(string)
  description = "Tags added to the AWS resources."
  default     = {}
}

variable "kms_key_arn" {
  type        = string
  description = "ARN of the AWS regional KMS key that encrypts the tunnel logs."
}
