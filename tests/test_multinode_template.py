"""The stack's side of multi-node jobs and of SSE-KMS's cost, in the template and in moto.

Multi-node parallel jobs: a queue of their own whose one compute environment is on-demand EC2
(Batch runs none on Spot), a security group whose rule lets the nodes reach each other, S3
through a gateway endpoint (the nodes' interfaces have no public IP) and the signing key through
ECS secrets.
SSE-KMS: the bucket's default encryption enables an S3 Bucket Key (checked in the template:
moto's CloudFormation does not apply BucketKeyEnabled). The template is linted with
cfn-lint in tests/test_setup_resources.py; here it is read and created in moto's CloudFormation
(a ThreadedMotoServer on 127.0.0.1), with that module's helpers.
"""

import pytest
from test_setup_resources import create_stack, load_template, make_network, resources_of

pytestmark = pytest.mark.filterwarnings(  # moto says so when it skips the bucket policy
    "ignore:Tried to parse AWS.*BucketPolicy:UserWarning")


@pytest.fixture(scope="module")
def template():
    return load_template()


def test_multi_node_jobs_have_an_on_demand_queue_of_their_own(template):
    resources = template["Resources"]
    queue = resources["MultiNodeJobQueue"]["Properties"]
    assert queue["JobQueueName"] == {"Fn::Sub": "${AWS::StackName}-multinode"}
    (order,) = queue["ComputeEnvironmentOrder"]
    environment = resources[order["ComputeEnvironment"]["Ref"]]["Properties"]["ComputeResources"]
    assert environment["Type"] == "EC2" and environment["MinvCpus"] == 0  # on-demand, not SPOT
    assert template["Outputs"]["MultiNodeJobQueue"]["Value"] == {"Ref": "MultiNodeJobQueue"}
    # the EC2 queue (Spot for the overflow) no longer takes them; the client may submit to both
    submit = [s for s in resources["ClientPolicy"]["Properties"]["PolicyDocument"]["Statement"]
              if s["Sid"] == "SubmitToTheseQueues"][0]
    assert {"Ref": "MultiNodeJobQueue"} in submit["Resource"]


def test_nodes_reach_each_other_through_their_security_group(template):
    resources = template["Resources"]
    rule = resources["NodeSecurityGroupIngress"]["Properties"]
    group = {"Fn::GetAtt": ["NodeSecurityGroup", "GroupId"]}
    assert rule["GroupId"] == group and rule["SourceSecurityGroupId"] == group
    assert rule["IpProtocol"] == "-1"  # any port: the main node's server is the user's choice
    environment = resources["MultiNodeComputeEnvironment"]["Properties"]["ComputeResources"]
    assert "NodeSecurityGroup" in str(environment["SecurityGroupIds"])
    others = [name for name, r in resources_of(template, "AWS::Batch::ComputeEnvironment").items()
              if name != "MultiNodeComputeEnvironment"]
    for name in others:  # the rule is the multi-node compute environment's only
        assert "NodeSecurityGroup" not in str(resources[name])
    assert "no inbound rule" not in template["Parameters"]["SecurityGroupIds"]["Description"]


def test_nodes_reach_s3_through_a_gateway_endpoint_on_the_given_route_tables(template):
    """The nodes' task interfaces get no public IP: S3 through a gateway endpoint on
    RouteTableIds (free; no NAT gateway), made only when route tables are given."""
    parameter = template["Parameters"]["RouteTableIds"]
    assert (parameter["Type"], parameter["Default"]) == ("CommaDelimitedList", "")
    assert template["Conditions"]["HasRouteTables"] == {"Fn::Not": [{"Fn::Equals": [
        {"Fn::Join": ["", {"Ref": "RouteTableIds"}]}, ""]}]}
    endpoint = template["Resources"]["S3GatewayEndpoint"]
    assert (endpoint["Type"], endpoint["Condition"]) == ("AWS::EC2::VPCEndpoint", "HasRouteTables")
    properties = endpoint["Properties"]
    assert properties["VpcEndpointType"] == "Gateway"
    assert properties["ServiceName"] == {"Fn::Sub": "com.amazonaws.${AWS::Region}.s3"}
    assert properties["VpcId"] == {"Ref": "VpcId"}
    assert properties["RouteTableIds"] == {"Ref": "RouteTableIds"}
    # no endpoint policy: the hosts' ECR layer downloads (S3) take the same routes
    assert "PolicyDocument" not in properties


def test_nodes_get_the_signing_key_without_calling_secrets_manager(template):
    """The multinode copy the client registers keeps the stack's EC2 container, whose secrets
    carry the key (resolved by the ECS agent on the host's network)."""
    container = template["Resources"]["Ec2JobDefinition"]["Properties"]["ContainerProperties"]
    assert [s["Name"] for s in container["Secrets"]] == ["BATCHFUTURES_SIGNING_KEY"]


def test_sse_kms_uses_a_bucket_key(template):
    (rule,) = template["Resources"]["IoBucket"]["Properties"]["BucketEncryption"][
        "ServerSideEncryptionConfiguration"]
    assert rule["BucketKeyEnabled"] == {"Fn::If": ["HasKmsKey", True, {"Ref": "AWS::NoValue"}]}


# -- created in moto ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def aws():
    from s3server import admin_clients, private_moto_server

    with private_moto_server() as url:
        yield admin_clients(url)


@pytest.mark.slow
def test_the_multinode_stack_in_moto(aws, template):
    network = make_network(aws)
    ec2 = aws("ec2")
    (subnet,) = ec2.describe_subnets(SubnetIds=network["subnets"][:1])["Subnets"]
    vpc = subnet["VpcId"]
    key = aws("kms").create_key(Description="batchfutures payloads")["KeyMetadata"]["Arn"]
    (table,) = ec2.describe_route_tables(Filters=[
        {"Name": "vpc-id", "Values": [vpc]}, {"Name": "association.main", "Values": ["true"]}])[
        "RouteTables"]  # the VPC's main route table, as docs/aws.md finds the default VPC's
    outputs, physical = create_stack(aws, network, "bf-nodes", template, VpcId=vpc, KmsKeyArn=key,
                                     RouteTableIds=table["RouteTableId"])
    (endpoint,) = ec2.describe_vpc_endpoints(VpcEndpointIds=[physical["S3GatewayEndpoint"]])[
        "VpcEndpoints"]
    assert (endpoint["VpcEndpointType"], endpoint["ServiceName"]) == ("Gateway",
                                                                      "com.amazonaws.us-east-1.s3")
    assert endpoint["VpcId"] == vpc and endpoint["RouteTableIds"] == [table["RouteTableId"]]

    batch = aws("batch")
    (queue,) = batch.describe_job_queues(jobQueues=[outputs["MultiNodeJobQueue"]])["jobQueues"]
    assert queue["jobQueueName"] == "bf-nodes-multinode"
    (order,) = queue["computeEnvironmentOrder"]
    assert order["computeEnvironment"] == physical["MultiNodeComputeEnvironment"]
    (environment,) = batch.describe_compute_environments(
        computeEnvironments=[order["computeEnvironment"]])["computeEnvironments"]
    resources = environment["computeResources"]
    assert resources["type"] == "EC2"

    (group,) = ec2.describe_security_groups(GroupIds=[physical["NodeSecurityGroup"]])[
        "SecurityGroups"]
    assert group["VpcId"] == vpc
    assert set(resources["securityGroupIds"]) == {network["security_group"], group["GroupId"]}
    (inbound,) = group["IpPermissions"]
    assert inbound["IpProtocol"] == "-1"
    assert [p["GroupId"] for p in inbound["UserIdGroupPairs"]] == [group["GroupId"]]

    (rule,) = aws("s3").get_bucket_encryption(Bucket=outputs["IoBucket"])[
        "ServerSideEncryptionConfiguration"]["Rules"]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    # moto's CloudFormation drops BucketKeyEnabled (moto/s3/cloud_formation.py maps only the
    # algorithm and key): test_sse_kms_uses_a_bucket_key checks the template instead
