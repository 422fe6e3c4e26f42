"""S3's harshness on demand: the loopback proxy in front of moto answering 503 SlowDown."""

import boto3
import botocore.retries.standard
import pytest
import s3server
from botocore.config import Config
from botocore.exceptions import ClientError
from s3server import REGION, S3FaultProxy

# the fixtures this module uses (registered by being module attributes)
aws_env, moto_server = s3server.aws_env, s3server.moto_server
s3_bucket, s3_faults = s3server.s3_bucket, s3server.s3_faults


def client(endpoint, **retries):
    return boto3.client("s3", endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries=retries or {"total_max_attempts": 1}))


def test_every_request_slowed_down_is_s3s_503_with_its_xml_error(s3_faults, s3_bucket):
    s3 = client(s3_faults.endpoint)
    s3.put_object(Bucket=s3_bucket, Key="k", Body=b"v")  # no faults yet: forwarded to moto
    s3_faults.set(1.0)
    with pytest.raises(ClientError) as caught:
        s3.get_object(Bucket=s3_bucket, Key="k")
    error = caught.value.response
    assert error["Error"]["Code"] == "SlowDown"
    assert error["Error"]["Message"] == "Please reduce your request rate."
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert s3_faults.injected == 1
    s3_faults.set(0)
    assert s3.get_object(Bucket=s3_bucket, Key="k")["Body"].read() == b"v"


def test_a_fraction_slowed_down_is_absorbed_by_botocores_retries_and_is_reproducible(
        moto_server, s3_bucket, monkeypatch):
    monkeypatch.setattr(botocore.retries.standard.ExponentialBackoff, "delay_amount",
                        lambda self, context: 0)  # botocore's decisions, without their sleeps

    def run(seed):
        with S3FaultProxy(moto_server, 0.4, seed=seed) as proxy:
            s3 = client(proxy.endpoint, mode="standard", total_max_attempts=10)
            for n in range(10):
                s3.put_object(Bucket=s3_bucket, Key=f"k{n}", Body=str(n).encode())
            assert [s3.get_object(Bucket=s3_bucket, Key=f"k{n}")["Body"].read()
                    for n in range(10)] == [str(n).encode() for n in range(10)]
            return proxy.injected

    first = run(3)
    assert first > 0
    assert run(3) == first


def test_only_the_methods_asked_for_are_slowed_down(s3_faults, s3_bucket):
    s3 = client(s3_faults.endpoint)
    s3_faults.set(1.0, methods={"GET"})
    s3.put_object(Bucket=s3_bucket, Key="k", Body=b"v")
    with pytest.raises(ClientError, match="SlowDown"):
        s3.get_object(Bucket=s3_bucket, Key="k")


def test_s3fs_sees_the_faults_through_the_environment(s3_faults, s3_bucket):
    import s3fs

    fs = s3fs.S3FileSystem(anon=False, client_kwargs={"endpoint_url": s3_faults.endpoint},
                           config_kwargs={"retries": {"total_max_attempts": 1}},
                           skip_instance_cache=True)
    fs.retries = 1  # s3fs's own retry loop, once
    fs.pipe(f"{s3_bucket}/file", b"data")
    s3_faults.set(1.0)
    with pytest.raises(OSError):
        fs.cat(f"{s3_bucket}/file")
    s3_faults.set(0)
    assert fs.cat(f"{s3_bucket}/file") == b"data"
