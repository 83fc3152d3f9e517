"""The Python face on http:// addresses, from Debian's nginx on 127.0.0.1 serving the committed
fixtures (started and stopped here; skipped without nginx): loadstone.torch.load_file and
safe_open of an address give what safetensors gives for the local file, a sharded folder's
address loads as the folder does, and a missing object is loadstone's NotFoundError."""
import os
import shutil
import socket
import subprocess
import time

import pytest
import safetensors
import safetensors.torch

import loadstone
import loadstone.torch as lt
from conftest import FIXTURES, same_tensor

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not os.access(NGINX, os.X_OK):
        pytest.skip("no nginx on this machine (scripts/setup.sh installs Debian's)")
    scratch = tmp_path_factory.mktemp("nginx")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (scratch / "nginx.conf").write_text(f"""daemon off; master_process off; worker_processes 1;
pid {scratch}/nginx.pid; error_log {scratch}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log off; default_type application/octet-stream;
  client_body_temp_path {scratch}/body; proxy_temp_path {scratch}/proxy;
  fastcgi_temp_path {scratch}/fastcgi; uwsgi_temp_path {scratch}/uwsgi;
  scgi_temp_path {scratch}/scgi;
  server {{ listen 127.0.0.1:{port}; root {FIXTURES}; }}
}}
""")
    proc = subprocess.Popen([NGINX, "-p", str(scratch), "-c", str(scratch / "nginx.conf"),
                             "-e", str(scratch / "error.log")])
    try:
        for _ in range(100):  # 10 s at most
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("nginx did not start within 10 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_load_file_and_safe_open_of_an_address(server):
    local = FIXTURES / "safetensors" / "dtypes.safetensors"
    expected = safetensors.torch.load_file(local)
    got = lt.load_file(f"{server}/safetensors/dtypes.safetensors")
    assert list(got) == list(lt.load_file(local))
    for name, tensor in expected.items():
        assert same_tensor(got[name], tensor), name
    with loadstone.safe_open(f"{server}/safetensors/dtypes.safetensors", framework="pt") as f:
        with safetensors.safe_open(local, framework="pt") as ref:
            assert sorted(f.keys()) == sorted(ref.keys())
            assert f.metadata() == ref.metadata()
            for name in ref.keys():
                assert same_tensor(f.get_tensor(name), ref.get_tensor(name)), name


def test_a_sharded_folder_address_loads_as_the_folder(server):
    folder = FIXTURES / "safetensors" / "sharded"
    want = {}
    for shard in sorted(folder.glob("*.safetensors")):
        want.update(safetensors.torch.load_file(shard))
    got = lt.load_file(f"{server}/safetensors/sharded")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert same_tensor(got[name], tensor), name


def test_a_missing_object_is_not_found(server):
    with pytest.raises(loadstone.NotFoundError):
        lt.load_file(f"{server}/nope.safetensors")
