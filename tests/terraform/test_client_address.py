"""The API behind AWS's load balancer sees each client's own address (the sign-in throttle keys
on it) and a client cannot choose it: uvicorn trusts X-Forwarded-For only from the balancer's
subnets, and only the balancer can reach the API."""

from __future__ import annotations

from .hcl import MODULES_ROOT, parse_file

MAIN = MODULES_ROOT / "aws" / "control-plane" / "main.tf"


def _blocks(kind: str) -> dict:
    found = {}
    for block in parse_file(MAIN).get(kind, []):
        for type_name, named in block.items():
            for name, body in named.items():
                found[(type_name, name)] = body
    return found


def test_forwarded_for_is_trusted_from_the_balancers_subnets_only():
    locals_ = {k: v for block in parse_file(MAIN)["locals"] for k, v in block.items()}
    env = str(locals_["environment"])
    assert "FORWARDED_ALLOW_IPS" in env
    assert "data.aws_subnet.alb" in env and '"*"' not in env.split("FORWARDED_ALLOW_IPS")[1][:200]
    subnet = _blocks("data")[("aws_subnet", "alb")]
    assert "var.public_subnet_ids" in str(subnet["for_each"])
    # The module's load balancer is the one placed in those subnets.
    alb = {k: v for block in parse_file(MAIN)["module"] for k, v in block.items()}["alb"]
    assert alb["public_subnet_ids"] == "${var.public_subnet_ids}"


def test_only_the_balancer_reaches_the_api_port():
    rules = {name: body for (kind, name), body in _blocks("resource").items()
             if kind == "aws_vpc_security_group_ingress_rule" and "aws_security_group.services" in str(body["security_group_id"])}
    assert rules, "the services' security group has no ingress rule"
    for name, body in rules.items():
        assert "module.alb.security_group_id" in str(body.get("referenced_security_group_id")), name
        assert "cidr_ipv4" not in body and "cidr_ipv6" not in body, name
