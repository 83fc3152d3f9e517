#!/usr/bin/env python3
"""How late each module of the execution order is, against its share of the bytes, for several
staging sizes (bench/README.md, issue 34):

    python3 bench/order_lateness.py MODEL [--runs 3] [--staging 256MiB 128MiB 64MiB]

Cold `loadstone load MODEL --json` runs (posix_fadvise DONTNEED first); a module is a layer
("model.layers.N") or a tensor's parent; its ready time is its last tensor's `ready_ms`. Prints,
per staging size, each run's (load ms, worst lateness: ready / T − cumulative byte share).
"""
import argparse
import json
import math
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cold_load(model, staging):
    for name in [model] if os.path.isfile(model) else os.listdir(model):
        path = name if os.path.isfile(model) else os.path.join(model, name)
        if path.endswith(".safetensors"):
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    cmd = [os.path.join(ROOT, "build", "loadstone"), "load", model, "--json", "--staging", staging]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def worst_lateness(doc):
    total_ms = doc["seconds"] * 1000
    modules = {}
    for t in doc["tensors"]:
        parts = t["name"].split(".")
        module = ".".join(parts[:3]) if len(parts) > 3 and parts[1] == "layers" else \
            ".".join(parts[:-1])
        ready, size = modules.get(module, (0.0, 0))
        elem = 2 if t["dtype"] in ("BF16", "F16") else 4
        modules[module] = (max(ready, t["ready_ms"]), size + elem * math.prod(t["shape"]))
    everything = sum(size for _, size in modules.values())
    done, worst = 0, 0.0
    for ready, size in sorted(modules.values()):
        done += size
        worst = max(worst, ready / total_ms - done / everything)
    return round(total_ms), round(worst, 4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--staging", nargs="+", default=["256MiB", "128MiB", "64MiB"])
    args = parser.parse_args()
    for staging in args.staging:
        print(staging, [worst_lateness(cold_load(args.model, staging)) for _ in range(args.runs)])


if __name__ == "__main__":
    main()
