#!/usr/bin/env python3
"""Interleaved A/B of two loadstone binaries on one model, cold and warm (bench/README.md):

  bench/ab.py OLD_BINARY NEW_BINARY MODEL [--rounds 5] [--seed 1] [--modes cold,warm]
              [--settle SECONDS] [-- EXTRA LOAD FLAGS]

Each round runs both binaries' `load MODEL --json` in a fresh random order, in each mode:
cold = every file fdatasync'ed and dropped from the page cache (POSIX_FADV_DONTNEED) before the
run, warm = every file read through the page cache before it; then --settle seconds (default 1)
before the run: on a VM that hands freed memory back to its host, a warm run right after
another one's 3.6 GiB was freed can take half the speed, whichever binary (bench/README.md).
With --pin (warm runs only), the model's files are held in the page cache (mapped and mlock'ed)
for the whole run, so that a VM reclaiming page cache behind the runs (DAMON's kdamond) cannot
turn a warm run partly cold. Prints one JSON document: each run's GB/s, the medians, and
new/old per mode (higher is faster), and the start-up of each run as `load --json` reports it
(open_ms, plan_ms, first_tensor_ms, counted from the Open call) with its medians. Only the
standard library.
"""
import argparse
import ctypes
import json
import mmap
import os
import random
import statistics
import subprocess
import sys
import time


def files_of(model):
    if os.path.isfile(model):
        return [model]
    return sorted(os.path.join(model, f) for f in os.listdir(model) if f.endswith(".safetensors"))


def drop(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(files):
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass


class Pinned:
    """The files mapped shared and mlock'ed (libc's mmap and mlock): resident in the page cache
    while this process lives."""

    def __init__(self, files):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        for f in files:
            fd = os.open(f, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    continue
                addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
                if addr in (None, ctypes.c_void_p(-1).value):
                    raise OSError(ctypes.get_errno(), f"cannot map {f}")
                if libc.mlock(addr, size) != 0:
                    raise OSError(ctypes.get_errno(), f"mlock of {f} ({size} bytes) refused")
            finally:
                os.close(fd)


STARTUP = ("open_ms", "plan_ms", "first_tensor_ms")


def run(binary, model, extra):
    out = subprocess.run([binary, "load", model, "--json", *extra], capture_output=True,
                         text=True, check=True).stdout
    doc = json.loads(out)
    return doc["gbps"], {key: doc.get(key) for key in STARTUP}


def startup_medians(times):
    """The median of each start-up figure over the runs that report it (an older binary may
    report none)."""
    medians = {}
    for key in STARTUP:
        values = [t[key] for t in times if t[key] is not None]
        if values:
            medians[key] = statistics.median(values)
    return medians


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="cold,warm", help="cold, warm or both (comma-separated)")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds of quiet before each run")
    ap.add_argument("--pin", action="store_true",
                    help="warm runs only: hold the files in the page cache (mlock) throughout")
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args()
    if args.pin and "cold" in args.modes.split(","):
        ap.error("--pin holds the files in the page cache: give --modes warm")
    rng = random.Random(args.seed)
    files = files_of(args.model)
    modes = args.modes.split(",")
    if args.pin:
        warm(files)
        Pinned(files)
    runs = {mode: {"old": [], "new": []} for mode in modes}
    startup = {mode: {"old": [], "new": []} for mode in modes}
    for _ in range(args.rounds):
        for mode in modes:
            order = ["old", "new"]
            rng.shuffle(order)
            for which in order:
                (drop if mode == "cold" else warm)(files)
                time.sleep(args.settle)
                binary = args.old if which == "old" else args.new
                gbps, times = run(binary, args.model, args.extra)
                runs[mode][which].append(gbps)
                startup[mode][which].append(times)
    doc = {"old": args.old, "new": args.new, "model": args.model, "rounds": args.rounds,
           "seed": args.seed, "settle": args.settle, "pin": args.pin, "extra": args.extra,
           "gbps": runs, "startup": startup}
    for mode in runs:
        old, new = statistics.median(runs[mode]["old"]), statistics.median(runs[mode]["new"])
        doc[f"{mode}_median_gbps"] = {"old": old, "new": new}
        doc[f"{mode}_new_over_old"] = new / old
        doc[f"{mode}_startup_median_ms"] = {which: startup_medians(startup[mode][which])
                                            for which in ("old", "new")}
    json.dump(doc, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
