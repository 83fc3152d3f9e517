#!/usr/bin/env python3
"""The GPU benchmark's harness (bench/gpu/bench.py) without a GPU, so that the one run a GPU
machine gets is not lost to a harness bug: a stand-in `torch` module (timings of nothing), a
stand-in loadstone CLI, and the real peers' imports (absent here: reported as errors).

Checks: the binary path check.sh passes is where CMake puts the CLI; every result is measured
or carries its error; the JSON is on disk after each result; --budget-s skips what it must.
Usage: gpu_bench_harness_test.py --bench bench/gpu/bench.py --cli BUILT_CLI --expected-cli PATH
"""
import argparse
import importlib.util
import json
import os
import stat
import sys
import tempfile
import types


def fake_torch():
    torch = types.ModuleType("torch")
    torch.__version__ = "stand-in"
    torch.uint8 = "uint8"

    class Tensor:
        def copy_(self, other, non_blocking=False):
            return self

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return 20.0  # ms: 1 GiB in 20 ms, a 53.7 GB/s "ceiling"

    torch.empty = lambda *a, **k: Tensor()
    torch.cuda = types.SimpleNamespace(
        synchronize=lambda: None, empty_cache=lambda: None, Event=Event,
        get_device_name=lambda i: "stand-in GPU")
    return torch


FAKE_CLI = """#!/bin/sh
# a stand-in `loadstone load ... --json`: what the real one prints, minus the tensors
echo '{"bytes": 1, "seconds": 0.01, "gbps": 1.0, "backend": "stand-in", "tensors": []}'
"""


def check(condition, what):
    if not condition:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def run(bench, argv, cli):
    with open(cli, "w") as f:
        f.write(FAKE_CLI)
    os.chmod(cli, os.stat(cli).st_mode | stat.S_IXUSR)
    return bench.main(argv + ["--loadstone", cli])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--cli", required=True, help="where the build put the loadstone CLI")
    ap.add_argument("--expected-cli", required=True, help="where check.sh looks for it")
    args = ap.parse_args()
    check(os.path.realpath(args.cli) == os.path.realpath(args.expected_cli),
          f"check.sh passes {args.expected_cli} but the CLI is built at {args.cli}")
    text = open(os.path.join(os.path.dirname(args.bench), "check.sh")).read()
    check('--loadstone "$BUILD/loadstone"' in text, "check.sh no longer passes $BUILD/loadstone")

    sys.modules["torch"] = fake_torch()
    spec = importlib.util.spec_from_file_location("gpu_bench", args.bench)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        common = ["--out", out, "--size-gb", "0.04", "--shard-gb", "0.02", "--repeat", "1",
                  "--disk", os.path.join(tmp, "disk"), "--shm", os.path.join(tmp, "shm")]
        cli = os.path.join(tmp, "loadstone")

        # Each result is written as it comes: count the rewrites.
        writes = []
        real_write = bench.write_doc
        bench.write_doc = lambda doc, path: (writes.append(len(doc["results"])),
                                             real_write(doc, path))
        check(run(bench, common, cli) == 0, "bench.py did not finish")
        doc = json.load(open(out))
        results = doc["results"]
        check(doc["gpu"] == "stand-in GPU" and abs(doc["ceiling"]["gbps"] - 53.687) < 0.01,
              f"ceiling: {doc.get('ceiling')}")
        check("loadstone_error" not in doc, doc.get("loadstone_error"))
        check(len(results) == 32, f"{len(results)} results, 32 expected")
        check(writes[-1] == 32 and all(n in writes for n in range(1, 33)),
              f"results written after each one: {writes}")
        for r in results:
            check(("gbps" in r) != ("error" in r), f"measured or failed, not both: {r}")
            if r["method"].startswith("loadstone"):
                check(r.get("loadstone_json", {}).get("backend") == "stand-in", r)
                check(r["ratio_vs_ceiling"] > 0, r)
            else:  # the peers do not import here: each one says why
                check("Error" in r.get("error", ""), r)
        check(sum(r["method"].startswith("loadstone") for r in results) == 12, "loadstone runs")

        # A budget already spent: every measurement is reported skipped, none is missing.
        check(run(bench, common + ["--budget-s", "0"], cli) == 0, "bench.py with no budget")
        results = json.load(open(out))["results"]
        check(len(results) == 32 and all("out of time" in r.get("skipped", "") for r in results),
              "--budget-s 0 skips every measurement")

        # No binary where it is said to be: said once, in the document.
        check(bench.main(common + ["--loadstone", os.path.join(tmp, "none")]) == 0, "no binary")
        check("no loadstone binary" in json.load(open(out)).get("loadstone_error", ""),
              "a missing binary is reported")
    print("gpu bench harness: OK")


if __name__ == "__main__":
    main()
