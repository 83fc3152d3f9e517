#!/usr/bin/env python3
"""The LibTorch face's benchmark (bench/README.md, "LibTorch face"), warm, in one interleaved run:

    python3 bench/torch_bench.py MODEL [--rounds N] [--seed S] [--out FILE]

Each round runs every method of build/bench/torch_bench once, in a fresh process, in a fresh
random order, the model's files read once before each run (warm page cache). Prints and writes
(bench/results/torch-DATE.json unless --out) the median seconds per method and the ratios the
issue asks for: LoadStateDict against Loader::Load, LoadInto of allocated parameters against
the raw page-cache read ceiling and against the plain LibTorch loader.
"""
import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ["load", "state_dict", "into_fresh", "into_allocated", "libtorch", "raw_read"]


def warm(model):
    files = [os.path.join(model, f) for f in sorted(os.listdir(model))] if os.path.isdir(model) else [model]
    for path in files:
        if os.path.isfile(path):
            with open(path, "rb") as f:
                while f.read(64 << 20):
                    pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out")
    parser.add_argument("--binary", default=os.path.join(REPO, "build", "bench", "torch_bench"))
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    runs = {m: [] for m in METHODS}
    for r in range(args.rounds):
        order = METHODS[:]
        rng.shuffle(order)
        for method in order:
            warm(args.model)
            out = subprocess.run([args.binary, method, args.model], check=True, capture_output=True, text=True)
            doc = json.loads(out.stdout.strip().splitlines()[-1])
            runs[method].append(doc["seconds"])
            print(f"round {r + 1}: {method:15s} {doc['seconds']:.3f} s  {doc['gbps']:.2f} GB/s", file=sys.stderr)
    nbytes = doc["bytes"]
    median = {m: statistics.median(v) for m, v in runs.items()}
    gbps = {m: nbytes / s / 1e9 for m, s in median.items()}
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "model": args.model, "bytes": nbytes, "rounds": args.rounds, "seed": seed, "warm": True,
        "cpus": os.cpu_count(),
        "median_seconds": median, "gbps": gbps, "runs": runs,
        "ratios": {
            "state_dict_time_over_load": median["state_dict"] / median["load"],
            "into_allocated_over_raw_read_ceiling": gbps["into_allocated"] / gbps["raw_read"],
            "into_fresh_over_raw_read_ceiling": gbps["into_fresh"] / gbps["raw_read"],
            "into_allocated_speedup_over_libtorch": median["libtorch"] / median["into_allocated"],
        },
    }
    out = args.out or os.path.join(REPO, "bench", "results", f"torch-{datetime.date.today()}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    for m in METHODS:
        print(f"{m:15s} {median[m]:.3f} s  {gbps[m]:.2f} GB/s")
    for k, v in result["ratios"].items():
        print(f"{k}: {v:.3f}")
    print(out)


if __name__ == "__main__":
    main()
