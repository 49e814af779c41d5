"""The real S3-compatible server the tests and ``atlas cluster up --s3`` run (versitygw on its POSIX backend,
atlas_cluster/s3.py), driven with boto3: a round trip, and the error each fault gets from it — the codes that code
classifying S3 errors (access denied / not found / unreachable) is written against."""

from __future__ import annotations

import subprocess
import sys

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError

from harness.env import free_port, python_env

NO_RETRIES = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=10)


def _error(call) -> tuple[str, int]:
    with pytest.raises(ClientError) as caught:
        call()
    response = caught.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_put_get_list_round_trip(s3_server):
    bucket = s3_server.bucket("round-trip")
    s3 = s3_server.client()
    s3.put_object(Bucket=bucket, Key="runs/a/checkpoint-2/model.bin", Body=b"\x00\x01weights")
    s3.put_object(Bucket=bucket, Key="runs/a/result.json", Body=b'{"ok": true}')
    s3.put_object(Bucket=bucket, Key="other.txt", Body=b"x")

    assert s3.get_object(Bucket=bucket, Key="runs/a/checkpoint-2/model.bin")["Body"].read() == b"\x00\x01weights"
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="runs/a/")
    assert [o["Key"] for o in listed["Contents"]] == ["runs/a/checkpoint-2/model.bin", "runs/a/result.json"]
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    # The POSIX backend: a bucket is a folder, an object a file under it.
    assert (s3_server.data / bucket / "runs/a/result.json").read_bytes() == b'{"ok": true}'


def test_env_points_a_client_in_another_process_at_the_server(s3_server):
    bucket = s3_server.bucket("from-env")
    script = (
        "import boto3; s3 = boto3.client('s3'); "
        f"s3.put_object(Bucket='{bucket}', Key='k', Body=b'v'); "
        f"print(s3.get_object(Bucket='{bucket}', Key='k')['Body'].read().decode())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=python_env(**s3_server.env()),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "v"


def test_wrong_secret_is_signature_does_not_match(s3_server):
    bucket = s3_server.bucket("wrong-secret")
    s3 = s3_server.client(aws_secret_access_key="not-the-secret", config=NO_RETRIES)
    assert _error(lambda: s3.list_objects_v2(Bucket=bucket)) == ("SignatureDoesNotMatch", 403)
    assert _error(lambda: s3.put_object(Bucket=bucket, Key="k", Body=b"v")) == ("SignatureDoesNotMatch", 403)


def test_unknown_access_key_is_invalid_access_key_id(s3_server):
    bucket = s3_server.bucket("unknown-key")
    s3 = s3_server.client(aws_access_key_id="ATNOSUCHKEY000000000", config=NO_RETRIES)
    assert _error(lambda: s3.get_object(Bucket=bucket, Key="k")) == ("InvalidAccessKeyId", 403)


def test_missing_key_is_no_such_key(s3_server):
    bucket = s3_server.bucket("missing-key")
    s3 = s3_server.client(config=NO_RETRIES)
    assert _error(lambda: s3.get_object(Bucket=bucket, Key="nope")) == ("NoSuchKey", 404)
    # A HEAD has no body: botocore names the error by its status.
    assert _error(lambda: s3.head_object(Bucket=bucket, Key="nope")) == ("404", 404)


def test_missing_bucket_is_no_such_bucket(s3_server):
    s3 = s3_server.client(config=NO_RETRIES)
    assert _error(lambda: s3.get_object(Bucket="no-such-bucket", Key="k")) == ("NoSuchBucket", 404)
    assert _error(lambda: s3.list_objects_v2(Bucket="no-such-bucket")) == ("NoSuchBucket", 404)
    assert _error(lambda: s3.put_object(Bucket="no-such-bucket", Key="k", Body=b"v")) == ("NoSuchBucket", 404)


def test_nothing_listening_is_endpoint_connection_error(s3_server):
    s3 = s3_server.client(endpoint_url=f"http://127.0.0.1:{free_port()}", config=NO_RETRIES)
    with pytest.raises(EndpointConnectionError):
        s3.list_buckets()


def test_bucket_names_s3_refuses_are_refused(s3_server):
    for name in ("A", "ab", "Upper-Case", "under_score", "-dash", "192.168.0.1", "a..b"):
        with pytest.raises(ValueError, match="not a valid S3 bucket name"):
            s3_server.bucket(name)
