output "vpc_id" {
  description = "Id of the VPC."
  value       = aws_vpc.this.id
}

output "vpc_arn" {
  description = "ARN of the VPC (scopes the control plane's RunInstances permission)."
  value       = aws_vpc.this.arn
}

output "cidr_block" {
  description = "IPv4 CIDR of the VPC."
  value       = aws_vpc.this.cidr_block
}

output "private_subnet_ids" {
  description = "Private subnet id per zone, in the order of var.zones."
  value       = [for zone in var.zones : aws_subnet.private[zone].id]
}

output "private_subnets_by_zone" {
  description = "Private subnet id keyed by availability zone (GPU nodes, services, data stores)."
  value       = { for zone, subnet in aws_subnet.private : zone => subnet.id }
}

output "public_subnet_ids" {
  description = "Public subnet ids (load balancers and NAT gateways only)."
  value       = [for zone in var.zones : aws_subnet.public[zone].id]
}

output "private_route_table_ids" {
  description = "Route table ids of the private subnets (for peering routes)."
  value       = [for zone in var.zones : aws_route_table.private[zone].id]
}

output "zones" {
  description = "Availability zones the network spans."
  value       = var.zones
}
