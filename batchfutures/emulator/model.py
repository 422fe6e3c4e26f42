"""botocore's Batch and CloudWatch Logs models: request validation, errors, ARNs.

The emulator takes and returns the dicts of boto3's clients, so it checks each request against
the operation's input shape exactly as botocore does before sending one (`ParamValidationError`),
and raises every other error as the `ClientError` boto3 would build from the service's answer.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Mapping, Optional

from botocore.exceptions import ClientError, ParamValidationError

REGION = "us-east-1"
ACCOUNT = "123456789012"
LOG_GROUP = "/aws/batch/job"

# HTTP status of each error code Batch (and Logs) answers with.
HTTP_STATUS = {
    "ClientException": 400,
    "ServerException": 500,
    "TooManyRequestsException": 429,
    "ThrottlingException": 400,
    "ResourceNotFoundException": 400,
    "InvalidParameterException": 400,
}

_models: Dict[str, Any] = {}
_models_lock = threading.Lock()
_validator: Any = None


def service_model(service: str = "batch") -> Any:
    """botocore's model of `service`, loaded once per process."""
    model = _models.get(service)
    if model is None:
        with _models_lock:
            model = _models.get(service)
            if model is None:
                # start-up: botocore.session costs ~100 ms; the modules that import this one
                # for its errors and ARNs (the runtime's container.py) never need a model
                import botocore.session

                model = botocore.session.get_session().get_service_model(service)
                _models[service] = model
    return model


# Members the emulator answers with that botocore's Batch model gained only in 2026. With an
# older botocore, boto3 drops them from AWS's answers; the emulator's answers lose them too.
NEWER_MEMBERS = (("JobDetail", "isCancelled"), ("JobDetail", "isTerminated"),
                 ("JobSummary", "isCancelled"), ("JobSummary", "isTerminated"),
                 ("ArrayPropertiesDetail", "statusSummaryLastUpdatedAt"),
                 ("ArrayPropertiesSummary", "statusSummaryLastUpdatedAt"))
_older_model: Optional[bool] = None


def model_has(shape: str, member: str, service: str = "batch") -> bool:
    """Whether the installed botocore's model knows ``shape.member``."""
    return member in service_model(service).shape_for(shape).members


def as_boto3_returns(operation: str, response: Dict[str, Any]) -> Dict[str, Any]:
    """A Batch answer as boto3 would return it from AWS: without the members the installed
    botocore's model does not know (a no-op, and free, with a model that knows them all)."""
    global _older_model
    if _older_model is None:
        _older_model = not all(model_has(shape, member) for shape, member in NEWER_MEMBERS)
    if not _older_model:
        return response
    return _known_only(response, service_model("batch").operation_model(operation).output_shape)


def _known_only(value: Any, shape: Any) -> Any:
    if shape is None:
        return value
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        members = shape.members
        return {k: _known_only(v, members[k]) for k, v in value.items() if k in members}
    if kind == "list" and isinstance(value, list):
        return [_known_only(v, shape.member) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: _known_only(v, shape.value) for k, v in value.items()}
    return value


def validate_request(operation: str, params: Mapping[str, Any], service: str = "batch") -> None:
    """Raise ParamValidationError, as boto3 would, when `params` do not fit the input shape."""
    global _validator
    if _validator is None:
        from botocore.validate import ParamValidator  # start-up: as service_model's

        _validator = ParamValidator()
    shape = service_model(service).operation_model(operation).input_shape
    report = _validator.validate(dict(params), shape)
    if report.has_errors():
        raise ParamValidationError(report=report.generate_report())


def client_error(message: str, code: str = "ClientException", status: Optional[int] = None,
                 operation: str = "Batch") -> ClientError:
    """The ClientError boto3 raises for an error answer of the service."""
    response = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status or HTTP_STATUS.get(code, 400)},
    }
    return ClientError(response, operation)


def job_arn(job_id: str) -> str:
    return f"arn:aws:batch:{REGION}:{ACCOUNT}:job/{job_id}"


def queue_arn(name: str) -> str:
    return f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/{name}"


def compute_environment_arn(name: str) -> str:
    return f"arn:aws:batch:{REGION}:{ACCOUNT}:compute-environment/{name}"


def cluster_arn(name: str) -> str:
    return f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/{name}"


def scheduling_policy_arn(name: str) -> str:
    return f"arn:aws:batch:{REGION}:{ACCOUNT}:scheduling-policy/{name}"


def consumable_resource_arn(name: str) -> str:
    return f"arn:aws:batch:{REGION}:{ACCOUNT}:consumable-resource/{name}"


def definition_arn(name: str, revision: int) -> str:
    return f"arn:aws:batch:{REGION}:{ACCOUNT}:job-definition/{name}:{revision}"


def task_arn(cluster: str, task_id: str) -> str:
    return f"arn:aws:ecs:{REGION}:{ACCOUNT}:task/{cluster}/{task_id}"


def arn_resource(value: str, kind: str) -> Optional[str]:
    """The resource part of a Batch ARN of `kind` ('job', 'job-queue', ...), else None."""
    if value.startswith("arn:") and f":{kind}/" in value:
        return value.split(f":{kind}/", 1)[1]
    return None
