variable "name" {
  type        = string
  description = "Name tag of the peering connection."
}

variable "requester" {
  type = object({
    vpc_id          = string
    cidr_block      = string
    route_table_ids = list(string)
  })
  description = "VPC on the default provider's side: its id, CIDR and the private route tables that get a route to the accepter."
}

variable "accepter" {
  type = object({
    region          = string
    vpc_id          = string
    cidr_block      = string
    route_table_ids = list(string)
  })
  description = "VPC on the aws.accepter provider's side (another region of the same account)."
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}
