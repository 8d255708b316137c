output "peering_connection_id" {
  description = "Id of the VPC peering connection."
  value       = aws_vpc_peering_connection.this.id
}
