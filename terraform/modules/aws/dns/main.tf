resource "aws_route53_health_check" "edge" {
  for_each = var.endpoints

  type              = "HTTPS"
  fqdn              = each.value.fqdn
  port              = 443
  resource_path     = var.health_check_path
  enable_sni        = true
  request_interval  = 10
  failure_threshold = 3
  measure_latency   = true
  tags              = merge(var.tags, { Name = "nimbus-edge-${each.key}" })
}

# One latency record per region under the same name: Route 53 answers with the
# healthy edge closest to the resolver, and drops a region whose health check fails.
resource "aws_route53_record" "alias" {
  #checkov:skip=CKV2_AWS_23:The alias target is the regional edge load balancer created in the edge module.
  for_each = { for name, e in var.endpoints : name => e if e.alias != null }

  zone_id         = var.zone_id
  name            = var.record_name
  type            = "A"
  set_identifier  = each.key
  health_check_id = aws_route53_health_check.edge[each.key].id

  latency_routing_policy {
    region = each.value.latency_region
  }

  alias {
    name                   = each.value.alias.dns_name
    zone_id                = each.value.alias.zone_id
    evaluate_target_health = true
  }
}

resource "aws_route53_record" "address" {
  #checkov:skip=CKV2_AWS_23:The address is the global IP of a load balancer in another cloud (GCP), which Route 53 cannot reference as a resource.
  for_each = { for name, e in var.endpoints : name => e if e.ip_address != null }

  zone_id         = var.zone_id
  name            = var.record_name
  type            = "A"
  ttl             = 60
  records         = [each.value.ip_address]
  set_identifier  = each.key
  health_check_id = aws_route53_health_check.edge[each.key].id

  latency_routing_policy {
    region = each.value.latency_region
  }
}
