"""The stack's EC2 Spot hosts drain on an interruption notice, so a worker gets SIGTERM first."""

from test_setup_resources import load_template, resources_of, user_data_parts


def test_spot_hosts_turn_on_ecs_spot_instance_draining():
    template = load_template()
    ((kind, script),) = user_data_parts(template)
    assert kind == "text/cloud-boothook"
    assert "echo 'ECS_ENABLE_SPOT_INSTANCE_DRAINING=true' >> /etc/ecs/ecs.config" in script
    spot = [resource["Properties"]["ComputeResources"]
            for resource in resources_of(template, "AWS::Batch::ComputeEnvironment").values()
            if resource["Properties"]["ComputeResources"]["Type"] == "SPOT"]
    assert spot, "the stack has an EC2 Spot compute environment"
    for resources in spot:
        assert resources["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": "LaunchTemplate"}
