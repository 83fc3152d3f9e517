"""s3:// addresses through the CLI, against moto's S3 server on 127.0.0.1 (started and stopped
here), which checks SigV4 signatures once its set-up is done: the fixtures uploaded by boto3
(files, a sharded folder, variants, subfolders, .bin shards, a GGUF split set, GPTQ with its
config) load with the tensors and CRC-32s of the local load; a wrong secret is a 403 that says
to check the credentials; no credentials is an error naming where they were looked for; the
shared credentials file is read. Every wait is bounded."""
import json
import os
import pathlib
import socket
import subprocess
import time

import boto3
import pytest

CLI = os.environ["LOADSTONE_CLI"]
FIXTURES = pathlib.Path(os.environ["LOADSTONE_FIXTURES"])
BUCKET = "models"
FOLDERS = [
    "safetensors/sharded",
    "safetensors/variant",
    "safetensors/variant_sharded",
    "safetensors/diffusers",
    "torch/sharded",
    "bnb/sharded",
    "gptq/gptq4_g32",
    "gguf/split",
]
FILES = ["safetensors/dtypes.safetensors", "gguf/quantized.gguf", "torch/parameters.bin"]
# (path under the fixtures, flags): each loads from S3 as it does from the local copy.
CASES = [
    ("safetensors/dtypes.safetensors", []),
    ("gguf/quantized.gguf", []),
    ("torch/parameters.bin", []),
    ("safetensors/sharded", []),
    ("safetensors/variant", ["--variant", "fp16"]),
    ("safetensors/variant_sharded", ["--variant", "fp16"]),
    ("safetensors/diffusers", ["--subfolder", "text_encoder"]),
    ("safetensors/diffusers", ["--subfolder", "vae", "--variant", "fp16"]),
    ("torch/sharded", []),
    ("bnb/sharded", []),
    ("gptq/gptq4_g32", []),
    ("gguf/split/model-00001-of-00003.gguf", []),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # The first 3 actions (the IAM user, its key, its policy) go unsigned; every one after is
    # checked against the key.
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
    server = subprocess.Popen([os.environ["MOTO_SERVER"], "-H", "127.0.0.1", "-p", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):  # 20 s at most
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("moto's server did not start within 20 s")
        anonymous = dict(endpoint_url=endpoint, region_name="us-east-1",
                         aws_access_key_id="setup", aws_secret_access_key="setup")
        iam = boto3.client("iam", **anonymous)
        iam.create_user(UserName="loadstone")
        key = iam.create_access_key(UserName="loadstone")["AccessKey"]
        iam.put_user_policy(UserName="loadstone", PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                              aws_access_key_id=key["AccessKeyId"],
                              aws_secret_access_key=key["SecretAccessKey"])
        client.create_bucket(Bucket=BUCKET)
        for folder in FOLDERS:
            for f in sorted((FIXTURES / folder).rglob("*")):
                if f.is_file():
                    client.upload_file(str(f), BUCKET, str(f.relative_to(FIXTURES)))
        for f in FILES:
            client.upload_file(str(FIXTURES / f), BUCKET, f)
        home = tmp_path_factory.mktemp("home")  # no ~/.aws of the user's is read
        yield {"endpoint": endpoint, "key": key["AccessKeyId"],
               "secret": key["SecretAccessKey"], "home": str(home)}
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def env_for(s3, secret=None, keys=True):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=s3["home"], AWS_ENDPOINT_URL=s3["endpoint"], AWS_REGION="us-east-1")
    if keys:
        env.update(AWS_ACCESS_KEY_ID=s3["key"], AWS_SECRET_ACCESS_KEY=secret or s3["secret"])
    return env


def run(args, env=None):
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=120)


def tensors(out):
    doc = json.loads(out)
    for t in doc["tensors"]:
        t.pop("ready_ms", None)  # when, not what
    return doc


@pytest.mark.parametrize("path,flags", CASES, ids=[" ".join([p, *f]) for p, f in CASES])
def test_s3_loads_as_local(s3, path, flags):
    local = run(["load", str(FIXTURES / path), *flags, "--json"])
    assert local.returncode == 0, local.stderr
    remote = run(["load", f"s3://{BUCKET}/{path}", *flags, "--json"], env_for(s3))
    assert remote.returncode == 0, remote.stderr
    got, want = tensors(remote.stdout), tensors(local.stdout)
    assert got["tensors"] == want["tensors"]  # names, dtypes, shapes, devices, CRC-32s
    assert got["backend"].startswith("http (libcurl")
    assert got["read"]["network_bytes"] > 0


def test_s3_inspect_names_the_objects(s3):
    out = run(["inspect", f"s3://{BUCKET}/safetensors/sharded", "--json"], env_for(s3))
    assert out.returncode == 0, out.stderr
    local = run(["inspect", str(FIXTURES / "safetensors/sharded"), "--json"])
    assert json.loads(out.stdout)["tensors"] == json.loads(local.stdout)["tensors"]


def test_s3_wrong_secret_is_refused(s3):
    out = run(["load", f"s3://{BUCKET}/safetensors/dtypes.safetensors"], env_for(s3, "wrong"))
    assert out.returncode == 1
    assert "HTTP 403" in out.stderr and "check the token or credentials" in out.stderr
    assert f"s3://{BUCKET}/safetensors/dtypes.safetensors" in out.stderr


def test_s3_without_credentials_says_where_it_looked(s3):
    out = run(["load", f"s3://{BUCKET}/safetensors/dtypes.safetensors"], env_for(s3, keys=False))
    assert out.returncode == 1
    assert "no AWS credentials" in out.stderr and "AWS_ACCESS_KEY_ID" in out.stderr
    assert "/.aws/credentials" in out.stderr


def test_s3_reads_the_shared_credentials_file(s3, tmp_path):
    creds = tmp_path / "credentials"
    creds.write_text(f"[other]\naws_access_key_id = nope\naws_secret_access_key = nope\n"
                     f"[default]\naws_access_key_id = {s3['key']}\n"
                     f"aws_secret_access_key = {s3['secret']}\n")
    env = env_for(s3, keys=False)
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds)
    out = run(["load", f"s3://{BUCKET}/safetensors/sharded", "--json"], env)
    assert out.returncode == 0, out.stderr
    env["AWS_PROFILE"] = "other"
    refused = run(["load", f"s3://{BUCKET}/safetensors/sharded"], env)
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr


def test_s3_missing_object_and_folder(s3):
    out = run(["load", f"s3://{BUCKET}/nope.safetensors"], env_for(s3))
    assert out.returncode == 1 and "NotFound" in out.stderr
    folder = run(["load", f"s3://{BUCKET}/safetensors/edge"], env_for(s3))
    assert folder.returncode == 1
    assert f"no checkpoint at 's3://{BUCKET}/safetensors/edge'" in folder.stderr
