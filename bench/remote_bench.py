#!/usr/bin/env python3
"""Loading over http from nginx on 127.0.0.1 against aria2c downloading the same files, in one
run (bench/README.md, "Issue 35"):

  bench/remote_bench.py MODEL_FOLDER [--cli build/loadstone] [--rounds 5] [--seed 1]
                        [--runai PYTHON] [-- EXTRA LOAD FLAGS]

nginx (Debian's; one process on a free port of 127.0.0.1, stopped at the end) serves a copy
of the folder in /dev/shm, so that the server side runs at memory speed and the clients are
what is measured. Each round runs, in a fresh random order:
- aria2c -x16 -s16 -jN -k8M (N: the weight files, at most 16; the best of the settings tried,
  bench/README.md) downloading every weight file into a fresh folder of /dev/shm (memory, as a
  load's tensors are) — the bytes land in memory, nothing is parsed; deleted after;
- `loadstone load http://127.0.0.1:PORT/ --json`: the folder resolved by its known names, the
  headers, then every tensor into CPU memory (the same bytes, plus the work of a load);
- `loadstone load MODEL_FOLDER --json` on the local folder, warm (read through the page cache
  first) and cold (dropped from it first), for the first-tensor ratios;
- with --runai PYTHON (a Python with runai-model-streamer and runai-model-streamer-s3): Run:ai's
  SafetensorsStreamer streaming s3://models/SHARD... from the same nginx as an S3 endpoint
  (path style; nginx ignores the signature), each tensor cloned so that each owns its memory as
  a load's do, and `loadstone load s3://models/` from the same server. Both are timed in-process
  (Run:ai's from stream_files to the last clone, after its imports; loadstone's Open + Plan +
  load, as its --json reports them), so that Python's start-up is not charged to it.
Each is timed from its start to its exit (wall clock), its peak RSS from wait4's rusage.
Prints one JSON document: the runs, the medians, and the ratios the issue asks for —
loadstone http / aria2c throughput, first tensor remote / local, peak RSS against model +
staging + 64 MiB. Only the standard library (and nginx, aria2c on PATH or /usr/sbin).
"""
import argparse
import concurrent.futures
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from ab import drop, warm  # the page cache made warm or cold as bench/ab.py makes it

STAGING = 256 << 20  # LoaderOptions::staging_bytes' default


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(root, scratch):
    port = free_port()
    conf = os.path.join(scratch, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; master_process off; worker_processes 1;
pid {scratch}/nginx.pid; error_log {scratch}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000;
  client_body_temp_path {scratch}/body; proxy_temp_path {scratch}/proxy;
  fastcgi_temp_path {scratch}/fastcgi; uwsgi_temp_path {scratch}/uwsgi;
  scgi_temp_path {scratch}/scgi; default_type application/octet-stream;
  server {{ listen 127.0.0.1:{port}; root {root}; }}
}}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proc = subprocess.Popen([nginx, "-p", scratch, "-c", conf, "-e", f"{scratch}/error.log"])
    for _ in range(100):  # 10 s at most
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("remote_bench: nginx did not start within 10 s")


def tensor_bytes(model, weights):
    """The bytes of every tensor of the safetensors files (their headers' data offsets)."""
    total = 0
    for w in weights:
        with open(os.path.join(model, w), "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(t["data_offsets"][1] - t["data_offsets"][0]
                     for k, t in header.items() if k != "__metadata__")
    return total


# Run:ai's streamer over s3:// (argv: the shard names); prints {"seconds", "bytes"}, timed after
# the imports, each tensor cloned (its tensors are views of a reused buffer otherwise).
RUNAI = """
import json, sys, time
from runai_model_streamer import SafetensorsStreamer
files = ["s3://models/" + name for name in sys.argv[1:]]
start = time.perf_counter()
out = {}
with SafetensorsStreamer() as streamer:
    streamer.stream_files(files)
    for name, tensor in streamer.get_tensors():
        out[name] = tensor.clone()
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "bytes": sum(t.numel() * t.element_size() for t in out.values())}))
"""


def run_measured(cmd, env=None):
    """Runs `cmd` and reaps it with wait4 for its rusage: (wall seconds, peak RSS bytes, stdout)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    # Both pipes drained at once (a child filling stderr while stdout is read would block),
    # then the child reaped with wait4 for its rusage.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        out_f, err_f = pool.submit(proc.stdout.read), pool.submit(proc.stderr.read)
        out, err = out_f.result(), err_f.result()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"remote_bench: {' '.join(cmd)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return wall, usage.ru_maxrss * 1024, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--cli", default="build/loadstone")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runai", help="a Python with runai-model-streamer(-s3): adds the S3 methods")
    ap.add_argument("extra", nargs="*", help="extra `load` flags (after --)")
    args = ap.parse_args()
    model = os.path.abspath(args.model)
    weights = sorted(f for f in os.listdir(model) if f.endswith(".safetensors"))
    nbytes = sum(os.path.getsize(os.path.join(model, f)) for f in weights)
    scratch = tempfile.mkdtemp(prefix="loadstone-remote-bench-", dir="/dev/shm")
    root = os.path.join(scratch, "root")  # the server side at memory speed
    shutil.copytree(model, os.path.join(root, "models"))  # bucket "models", path style
    nginx, port = start_nginx(root, scratch)
    base = f"http://127.0.0.1:{port}/models/"
    s3_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    s3_env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_REGION="us-east-1",
                  AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                  AWS_EC2_METADATA_DISABLED="true", RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING="0")
    urls = os.path.join(scratch, "urls.txt")
    with open(urls, "w") as f:
        f.write("".join(f"{base}{w}\n" for w in weights))
    rng = random.Random(args.seed)
    runs = {"aria2c": [], "loadstone_http": [], "loadstone_local_warm": [],
            "loadstone_local_cold": []}
    if args.runai:
        runs.update(runai_s3=[], loadstone_s3=[])
    local_files = [os.path.join(model, f) for f in os.listdir(model)]
    try:
        for _ in range(args.rounds):
            order = list(runs)
            rng.shuffle(order)
            for what in order:
                if what == "runai_s3":
                    _, rss, out = run_measured([args.runai, "-c", RUNAI, *weights], s3_env)
                    doc = json.loads(out)
                    if doc["bytes"] != tensor_bytes(model, weights):
                        sys.exit(f"remote_bench: Run:ai streamed {doc['bytes']} bytes, not every tensor's")
                    runs[what].append({"seconds": doc["seconds"], "gbps": nbytes / doc["seconds"] / 1e9,
                                       "peak_rss": rss})
                elif what == "loadstone_s3":
                    _, rss, out = run_measured([args.cli, "load", "s3://models/", "--json", *args.extra],
                                               s3_env)
                    doc = json.loads(out)
                    seconds = (doc["open_ms"] + doc["plan_ms"]) / 1e3 + doc["seconds"]
                    runs[what].append({"seconds": seconds, "gbps": nbytes / seconds / 1e9, "peak_rss": rss,
                                       "first_tensor_ms": doc["first_tensor_ms"]})
                elif what == "aria2c":
                    dest = tempfile.mkdtemp(prefix="loadstone-aria2c-", dir="/dev/shm")
                    try:
                        wall, rss, _ = run_measured(
                            ["aria2c", "-q", "-x16", "-s16", f"-j{min(16, len(weights))}", "-k8M",
                             "--file-allocation=none",
                             "--allow-overwrite=true", "--auto-file-renaming=false",
                             "-d", dest, "-i", urls])
                        got = sum(os.path.getsize(os.path.join(dest, w)) for w in weights)
                        if got != nbytes:
                            sys.exit(f"remote_bench: aria2c wrote {got} bytes of {nbytes}")
                    finally:
                        shutil.rmtree(dest, ignore_errors=True)
                    runs[what].append({"seconds": wall, "gbps": nbytes / wall / 1e9, "peak_rss": rss})
                else:
                    where = base if what == "loadstone_http" else model
                    if what == "loadstone_local_warm":
                        warm(local_files)
                    elif what == "loadstone_local_cold":
                        drop(local_files)
                    wall, rss, out = run_measured([args.cli, "load", where, "--json", *args.extra])
                    doc = json.loads(out)
                    if what == "loadstone_http" and doc["read"]["network_bytes"] < doc["read_bytes"]:
                        sys.exit("remote_bench: the http load did not read over the network")
                    runs[what].append({"seconds": wall, "gbps": nbytes / wall / 1e9, "peak_rss": rss,
                                       "load_seconds": doc["seconds"],
                                       "first_tensor_ms": doc["first_tensor_ms"],
                                       "backend": doc["backend"]})
    finally:
        nginx.terminate()
        nginx.wait(timeout=10)
        shutil.rmtree(scratch, ignore_errors=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0] if m != "backend"}
           for k, v in runs.items()}
    bound = nbytes + STAGING + (64 << 20)
    print(json.dumps({
        "model": model, "weight_bytes": nbytes, "rounds": args.rounds, "seed": args.seed,
        "runs": runs, "medians": med,
        "ratios": {
            "http_vs_aria2c_throughput": med["loadstone_http"]["gbps"] / med["aria2c"]["gbps"],
            "first_tensor_remote_vs_local_warm": med["loadstone_http"]["first_tensor_ms"]
            / med["loadstone_local_warm"]["first_tensor_ms"],
            "first_tensor_remote_vs_local_cold": med["loadstone_http"]["first_tensor_ms"]
            / med["loadstone_local_cold"]["first_tensor_ms"],
            "http_peak_rss_vs_model_staging_64mib": med["loadstone_http"]["peak_rss"] / bound,
            **({"s3_loadstone_vs_runai_throughput": med["loadstone_s3"]["gbps"] / med["runai_s3"]["gbps"]}
               if args.runai else {}),
        },
    }, indent=1))


if __name__ == "__main__":
    main()
