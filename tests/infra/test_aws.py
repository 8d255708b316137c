"""AWS adapter against a real moto server over HTTP, and the EC2 error mapping."""

from __future__ import annotations

import base64
from typing import Any

import botocore.exceptions
import pytest

from infra.aws import LAUNCH_TOKEN_TAG, AwsProvider, client_token, map_boto_error, map_client_error
from infra.errors import CapacityError, ConfigError, ProviderError, QuotaError, RetryPolicy, TransientError
from infra.provider import InstanceState, LaunchRequest, ownership_tags
from tests.infra.conftest import AWS_REGION, free_port

USER_DATA = "#cloud-config\nruncmd:\n  - [echo, hello]\n"


def request(template: str, n: int, *, spot: bool = False, zone: str = "us-east-1b", subnet: str | None = None):
    return LaunchRequest(
        node_id=f"node-{n}",
        cluster="test-cluster",
        region=AWS_REGION,
        zone=zone,
        instance_type="g6e.xlarge",
        spot=spot,
        template_id=template,
        user_data=USER_DATA + f"# node {n}\n",
        tags={**ownership_tags("test-cluster", f"node-{n}", "pool-1"), "team": "ml"},
        idempotency_token=f"op-{n}",
        subnet=subnet,
    )


def describe_raw(ec2: Any, instance_id: str) -> dict:
    return ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]


def test_launch_three_with_tags_template_user_data_and_market(aws: AwsProvider, ec2: Any, aws_template: str):
    launched = [aws.launch(request(aws_template, n, spot=(n != 2))) for n in range(3)]

    assert len({i.instance_id for i in launched}) == 3
    for n, inst in enumerate(launched):
        raw = describe_raw(ec2, inst.instance_id)
        tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
        assert tags["managed-by"] == "nimbus"
        assert tags["nimbus-cluster"] == "test-cluster"
        assert tags["nimbus-node-id"] == f"node-{n}"
        assert tags["nimbus-pool-id"] == "pool-1"
        assert tags["team"] == "ml"
        assert tags["aws:ec2launchtemplate:id"] == aws_template  # launched from the template
        assert raw["InstanceType"] == "g6e.xlarge"  # per-node override of the template's type
        assert raw["Placement"]["AvailabilityZone"] == "us-east-1b"
        assert raw["ClientToken"] == f"op-{n}"
        assert (raw.get("InstanceLifecycle") == "spot") is (n != 2)
        assert inst.spot is (n != 2)
        user_data = ec2.describe_instance_attribute(InstanceId=inst.instance_id, Attribute="userData")
        assert base64.b64decode(user_data["UserData"]["Value"]).decode() == USER_DATA + f"# node {n}\n"
        assert inst.state in (InstanceState.PENDING, InstanceState.RUNNING)
        assert inst.cloud == "aws" and inst.region == AWS_REGION and inst.zone == "us-east-1b"
        assert inst.private_ip and inst.launched_at is not None
        assert "aws:ec2launchtemplate:id" not in inst.tags  # AWS-internal tags are not ours


def test_launch_into_subnet(aws: AwsProvider, ec2: Any, aws_template: str):
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.1.0/24", AvailabilityZone="us-east-1c")["Subnet"]
    inst = aws.launch(request(aws_template, 7, zone="us-east-1c", subnet=subnet["SubnetId"]))
    assert describe_raw(ec2, inst.instance_id)["SubnetId"] == subnet["SubnetId"]
    assert inst.zone == "us-east-1c"


def test_relaunch_with_same_token_returns_same_instance(aws: AwsProvider, ec2: Any, aws_template: str):
    first = aws.launch(request(aws_template, 1))
    again = aws.launch(request(aws_template, 1))
    assert again.instance_id == first.instance_id
    live = ec2.describe_instances(Filters=[{"Name": "tag:nimbus-node-id", "Values": ["node-1"]}])
    assert sum(len(r["Instances"]) for r in live["Reservations"]) == 1
    assert first.tags[LAUNCH_TOKEN_TAG] == client_token("op-1")


def test_describe_terminate_and_idempotent_terminate(aws: AwsProvider, ec2: Any, aws_template: str):
    inst = aws.launch(request(aws_template, 1))
    assert aws.describe(AWS_REGION, inst.instance_id).state == InstanceState.RUNNING  # moto runs at once

    aws.terminate(AWS_REGION, inst.instance_id)
    assert describe_raw(ec2, inst.instance_id)["State"]["Name"] == "terminated"
    assert aws.describe(AWS_REGION, inst.instance_id).state == InstanceState.TERMINATED

    aws.terminate(AWS_REGION, inst.instance_id)  # already terminated: fine
    aws.terminate(AWS_REGION, "i-0123456789abcdef0")  # never existed: fine
    assert aws.describe(AWS_REGION, "i-0123456789abcdef0") is None


def test_list_by_tag_finds_only_live_matching_instances(aws: AwsProvider, ec2: Any, aws_template: str):
    a, b, c = (aws.launch(request(aws_template, n)) for n in range(3))
    other = ec2.run_instances(
        MinCount=1,
        MaxCount=1,
        LaunchTemplate={"LaunchTemplateId": aws_template},
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "managed-by", "Value": "someone-else"}]}],
    )["Instances"][0]
    aws.terminate(AWS_REGION, c.instance_id)

    ours = aws.list_by_tag(AWS_REGION, {"managed-by": "nimbus", "nimbus-cluster": "test-cluster"})
    assert {i.instance_id for i in ours} == {a.instance_id, b.instance_id}
    assert other["InstanceId"] not in {i.instance_id for i in ours}
    assert [i.instance_id for i in aws.list_by_tag(AWS_REGION, {"nimbus-node-id": "node-1"})] == [b.instance_id]
    assert aws.list_by_tag(AWS_REGION, {"nimbus-cluster": "other-cluster"}) == []


def test_unknown_launch_template_is_an_error_not_a_vm(aws: AwsProvider, ec2: Any):
    # Real EC2 answers InvalidLaunchTemplateId.NotFound (mapped below); moto answers an
    # HTML 500, which must still come out as a ProviderError and create nothing.
    with pytest.raises(ProviderError):
        aws.launch(request("lt-0000000000000dead", 1))
    assert ec2.describe_instances()["Reservations"] == []


# -- error mapping: botocore's real ClientError built from EC2 error codes ----------


def client_error(code: str, status: int = 400, message: str = "boom") -> botocore.exceptions.ClientError:
    response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.exceptions.ClientError(response, "RunInstances")


@pytest.mark.parametrize(
    ("code", "status", "kind", "scope"),
    [
        ("InsufficientInstanceCapacity", 500, CapacityError, "zone"),
        ("InsufficientHostCapacity", 500, CapacityError, "zone"),
        ("Unsupported", 400, CapacityError, "zone"),
        ("SpotMaxPriceTooLow", 400, CapacityError, "zone"),
        ("VcpuLimitExceeded", 400, QuotaError, "region"),
        ("InstanceLimitExceeded", 400, QuotaError, "region"),
        ("MaxSpotInstanceCountExceeded", 400, QuotaError, "region"),
        ("AuthFailure", 401, ConfigError, "cloud"),
        ("UnauthorizedOperation", 403, ConfigError, "cloud"),
        ("InvalidLaunchTemplateId.NotFound", 400, ConfigError, "region"),
        ("InvalidLaunchTemplateName.NotFoundException", 400, ConfigError, "region"),
        ("RequestLimitExceeded", 503, TransientError, "none"),
        ("ServiceUnavailable", 503, TransientError, "none"),
        ("InternalError", 500, TransientError, "none"),
        ("SomethingNew", 502, TransientError, "none"),
        ("SomethingNew", 400, ProviderError, "zone"),
    ],
)
def test_ec2_error_codes_map_to_typed_errors(code: str, status: int, kind: type, scope: str):
    err = map_client_error(client_error(code, status))
    assert type(err) is kind
    assert err.scope == scope
    assert err.code == code


def test_connection_failures_are_transient():
    err = map_boto_error(botocore.exceptions.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert isinstance(err, TransientError)
    assert isinstance(map_boto_error(botocore.exceptions.NoCredentialsError()), ConfigError)


def test_throttling_is_retried_then_succeeds(aws_session, moto_endpoint, ec2, aws_template):
    provider = AwsProvider(session=aws_session, endpoint_url=moto_endpoint, retry_policy=RetryPolicy(attempts=3))
    client = provider._client(AWS_REGION)
    failures = iter([client_error("RequestLimitExceeded", 503)])
    sleeps: list[float] = []
    provider._sleep = sleeps.append

    def throttle_once(**kwargs):
        if (exc := next(failures, None)) is not None:
            raise exc

    # botocore's own event hook: runs in the real request path, before the HTTP call.
    client.meta.events.register("before-call.ec2.RunInstances", throttle_once)
    inst = provider.launch(request(aws_template, 1))
    assert inst.instance_id.startswith("i-")
    assert len(sleeps) == 1


def test_long_tokens_are_hashed_to_ec2_limit():
    token = "x" * 100
    assert len(client_token(token)) == 64
    assert client_token(token) == client_token(token)
    assert client_token("short") == "short"


def test_capacity_error_in_the_request_path_surfaces_typed_and_launches_nothing(aws: AwsProvider, ec2, aws_template):
    def no_capacity(**kwargs):
        raise client_error("InsufficientInstanceCapacity", 500, "We currently do not have sufficient capacity")

    aws._client(AWS_REGION).meta.events.register("before-call.ec2.RunInstances", no_capacity)
    with pytest.raises(CapacityError) as info:
        aws.launch(request(aws_template, 1, spot=True))
    assert info.value.scope == "zone" and info.value.code == "InsufficientInstanceCapacity"
    assert ec2.describe_instances()["Reservations"] == []


def test_unreachable_endpoint_is_transient(aws_session):
    provider = AwsProvider(
        session=aws_session, endpoint_url=f"http://127.0.0.1:{free_port()}", retry_policy=RetryPolicy(attempts=1)
    )
    with pytest.raises(TransientError):
        provider.describe(AWS_REGION, "i-0123456789abcdef0")
