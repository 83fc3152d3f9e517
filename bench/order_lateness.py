#!/usr/bin/env python3
"""How late each module of the execution order is, against its share of the bytes, for several
staging sizes and bounds on the bytes in flight (bench/README.md, issue 34):

    python3 bench/order_lateness.py MODEL [--runs 3] [--staging 256MiB 128MiB 64MiB]
                                          [--in-flight default 32MiB ...]

Cold `loadstone load MODEL --json` runs (posix_fadvise DONTNEED first); a module is a layer
("model.layers.N") or a tensor's parent; its ready time is its last tensor's `ready_ms`. Prints,
per setting, each run's (load ms, worst lateness: ready / T − cumulative byte share) and their
medians; the settings take turns, run by run, so that a slow spell of the disk hits them alike.
"""
import argparse
import json
import math
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cold_load(model, staging, in_flight, trace=None):
    for name in [model] if os.path.isfile(model) else os.listdir(model):
        path = name if os.path.isfile(model) else os.path.join(model, name)
        if path.endswith(".safetensors"):
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    cmd = [os.path.join(ROOT, "build", "loadstone"), "load", model, "--json", "--staging", staging]
    if in_flight != "default":
        cmd += ["--in-flight", in_flight]
    if trace:
        cmd += ["--trace", trace, "--overwrite"]
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


def reads_lateness(trace):
    """The same measure for the reads themselves: how far the bytes read by time t fall behind a
    straight line from 0 to the last read's end. This is the disk's own (its rate changing within
    a load, its completions coming in batches); module lateness above it is the loader's."""
    with open(trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    spans = [e for e in events if e.get("ph") == "X"]
    start = min(e["ts"] for e in spans)
    ends = sorted((e["ts"] + e["dur"] - start, e["args"]["bytes"])
                  for e in spans if e["name"].startswith("read "))
    total, last = sum(b for _, b in ends), ends[-1][0]
    done, worst = 0, 0.0
    for end, size in ends:
        done += size
        worst = max(worst, end / last - done / total)
    return round(worst, 4)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--staging", nargs="+", default=["256MiB", "128MiB", "64MiB"])
    parser.add_argument("--in-flight", nargs="+", default=["default"],
                        help="--in-flight sizes to try ('default': the flag left out)")
    parser.add_argument("--reads", type=int, default=0,
                        help="then this many traced loads (first setting): the reads' own lateness")
    args = parser.parse_args()
    settings = [(s, f) for s in args.staging for f in args.in_flight]
    runs = {setting: [] for setting in settings}
    for _ in range(args.runs):
        for setting in settings:
            runs[setting].append(worst_lateness(cold_load(args.model, *setting)))
    for (staging, in_flight), results in runs.items():
        print(f"staging {staging} in-flight {in_flight}: {results}; medians "
              f"{statistics.median(r[0] for r in results)} ms, "
              f"{statistics.median(r[1] for r in results)} late")
    trace = os.path.join("/tmp", f"order_lateness-{os.getpid()}.json")
    for _ in range(args.reads):
        ms, modules = worst_lateness(cold_load(args.model, *settings[0], trace=trace))
        print(f"traced: {ms} ms, modules {modules} late, the reads themselves "
              f"{reads_lateness(trace)} late")
    if args.reads:
        os.unlink(trace)


if __name__ == "__main__":
    main()
