# Edges route to replicas in every region and reach the control plane's Redis, so the
# regional VPCs of one deployment are peered over AWS's backbone.
resource "aws_vpc_peering_connection" "this" {
  vpc_id      = var.requester.vpc_id
  peer_vpc_id = var.accepter.vpc_id
  peer_region = var.accepter.region
  auto_accept = false
  tags        = merge(var.tags, { Name = var.name })
}

resource "aws_vpc_peering_connection_accepter" "this" {
  provider = aws.accepter

  vpc_peering_connection_id = aws_vpc_peering_connection.this.id
  auto_accept               = true
  tags                      = merge(var.tags, { Name = var.name })
}

resource "aws_route" "requester" {
  count = length(var.requester.route_table_ids)

  route_table_id            = var.requester.route_table_ids[count.index]
  destination_cidr_block    = var.accepter.cidr_block
  vpc_peering_connection_id = aws_vpc_peering_connection_accepter.this.id
}

resource "aws_route" "accepter" {
  provider = aws.accepter
  count    = length(var.accepter.route_table_ids)

  route_table_id            = var.accepter.route_table_ids[count.index]
  destination_cidr_block    = var.requester.cidr_block
  vpc_peering_connection_id = aws_vpc_peering_connection_accepter.this.id
}
