#!/usr/bin/env python3
"""Times the CPU peers on a checkpoint, each producing every tensor in its own host memory.

Usage: peers.py MODEL_DIR [--cold] [--repeat N]
Prints one JSON document: {"results": [{"method", "seconds": [...], "gbps"}]}.
Peers: safetensors.torch.load_file, safetensors safe_open + get_tensor (both cloned so that each
tensor owns its memory; their mmap-view results are reported too, as less work), Run:ai's model
streamer (SafetensorsStreamer, each yielded tensor cloned; the time without the clone too).
"""
import argparse
import glob
import json
import os
import statistics
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    files = shard_files(args.model)
    total = sum(os.path.getsize(f) for f in files)
    results = []
    for name, fn in PEERS.items():
        times, error = [], None
        for _ in range(args.repeat):
            if args.cold:
                drop_cache(files)
            else:
                warm_cache(files)
            try:
                t0 = time.perf_counter()
                tensors = fn(files)
                times.append(time.perf_counter() - t0)
                del tensors
            except Exception as e:  # a peer that does not run is reported, not skipped
                error = f"{type(e).__name__}: {e}"
                break
        entry = {"method": name, "seconds": times}
        if times:
            entry["gbps"] = total / statistics.median(times) / 1e9
        if error:
            entry["error"] = error
        results.append(entry)
    print(json.dumps({"bytes_on_disk": total, "mode": "cold" if args.cold else "warm",
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
