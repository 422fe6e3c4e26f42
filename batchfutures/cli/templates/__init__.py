"""Package data: the CloudFormation template and the worker Dockerfile."""
