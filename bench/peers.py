#!/usr/bin/env python3
"""Times the CPU peers on a checkpoint, each producing every tensor in its own host memory.

Usage: peers.py MODEL_DIR [--cold] [--repeat N]
Prints one JSON document: {"results": [{"method", "seconds": [...], "gbps"}]}.
Each run is a fresh process (imports done before the clock starts), peers interleaved.
Peers: safetensors.torch.load_file, safetensors safe_open + get_tensor (both cloned so that each
tensor owns its memory; their mmap-view results are reported too, as less work), Run:ai's model
streamer (SafetensorsStreamer, each yielded tensor cloned; the time without the clone too).
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time


def shard_files(model):
    if os.path.isfile(model):
        return [model]
    files = sorted(glob.glob(os.path.join(model, "*.safetensors")))
    if not files:
        sys.exit(f"no .safetensors files in {model}")
    return files


def drop_cache(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_cache(files):
    """Reads the files through the page cache, so that a warm run finds them there."""
    for f in files:
        with open(f, "rb", buffering=0) as h:
            while h.read(8 << 20):
                pass


def st_load_file(files):
    from safetensors.torch import load_file
    out = {}
    for f in files:
        out.update(load_file(f, device="cpu"))
    return out


def st_safe_open(files):
    from safetensors import safe_open
    out = {}
    for f in files:
        with safe_open(f, framework="pt", device="cpu") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def runai(files, clone=True):
    from runai_model_streamer import SafetensorsStreamer
    out = {}
    with SafetensorsStreamer() as s:
        s.stream_files(files)
        for name, tensor in s.get_tensors():
            out[name] = tensor.clone() if clone else tensor
    return out


def owned(fn):
    """safetensors hands out tensors backed by a private mapping of the file (no byte read
    until touched); .clone() gives each its own memory, the result every other method produces."""
    return lambda files: {k: v.clone() for k, v in fn(files).items()}


PEERS = {
    "safetensors-load_file+clone": owned(st_load_file),
    "safetensors-safe_open+clone": owned(st_safe_open),
    "safetensors-load_file (mmap views)": st_load_file,
    "safetensors-safe_open (mmap views)": st_safe_open,
    "runai-streamer": runai,
    "runai-streamer-noclone": lambda files: runai(files, clone=False),
}


def run_once(model, name):
    """One timed run of one peer in this (fresh) process; prints {"seconds": s} or {"error": e}.
    Imports happen before the clock starts."""
    import torch  # noqa: F401  (every peer needs it; not part of the time)
    import safetensors.torch  # noqa: F401
    try:
        import runai_model_streamer  # noqa: F401
    except ImportError:
        pass
    files = shard_files(model)
    try:
        t0 = time.perf_counter()
        tensors = PEERS[name](files)
        seconds = time.perf_counter() - t0
        del tensors
        print(json.dumps({"seconds": seconds}))
    except Exception as e:  # a peer that does not run is reported, not skipped
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--run", help=argparse.SUPPRESS)  # internal: one run of this peer
    args = ap.parse_args()
    if args.run:
        return run_once(args.model, args.run)
    files = shard_files(args.model)
    total = sum(os.path.getsize(f) for f in files)
    # Each run in a fresh process, like `loadstone bench` (a cold start gets fresh memory; a
    # long-lived process would reuse the heap its previous run freed), peers interleaved.
    times = {name: [] for name in PEERS}
    errors = {}
    for _ in range(args.repeat):
        for name in PEERS:
            if name in errors:
                continue
            time.sleep(2)  # let the previous run's memory settle, as `loadstone bench` does
            if args.cold:
                drop_cache(files)
            else:
                warm_cache(files)
            out = subprocess.run([sys.executable, __file__, args.model, "--run", name],
                                 capture_output=True, text=True)
            try:
                result = json.loads(out.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                result = {"error": f"exit {out.returncode}: {out.stderr.strip()[-300:]}"}
            if "error" in result:
                errors[name] = result["error"]
            else:
                times[name].append(result["seconds"])
    results = []
    for name in PEERS:
        entry = {"method": name, "seconds": times[name]}
        if times[name]:
            entry["gbps"] = total / statistics.median(times[name]) / 1e9
        if name in errors:
            entry["error"] = errors[name]
        results.append(entry)
    print(json.dumps({"bytes_on_disk": total, "mode": "cold" if args.cold else "warm",
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
