#!/usr/bin/env python3
"""The CPU peers, for `loadstone bench --peers "PYTHON bench/peers.py"`, which runs them in its
interleaved loop (same settle, same cold/warm page-cache preparation, same window as loadstone).

  peers.py --list               one JSON array: [{"name": str, "same_work": bool}]
  peers.py --run NAME FILE...   one timed run in this (fresh) process: {"seconds": s} or
                                {"error": e}; imports happen before the clock starts

Peers: safetensors.torch.load_file, safetensors safe_open + get_tensor (both cloned so that each
tensor owns its memory, the result loadstone produces; their mmap-view results too, as less
work: no byte is read until touched), Run:ai's model streamer (SafetensorsStreamer, each yielded
tensor cloned; the time without the clone too, as less work: the tensors are views of its
reused buffer).
"""
import argparse
import json
import sys
import time


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


# name: (function, same_work)
PEERS = {
    "safetensors-load_file+clone": (owned(st_load_file), True),
    "safetensors-safe_open+clone": (owned(st_safe_open), True),
    "safetensors-load_file-mmap-views": (st_load_file, False),
    "safetensors-safe_open-mmap-views": (st_safe_open, False),
    "runai-streamer+clone": (runai, True),
    "runai-streamer-noclone": (lambda files: runai(files, clone=False), False),
}


def run_once(name, files):
    import torch  # noqa: F401  (every peer needs it; not part of the time)
    import safetensors.torch  # noqa: F401
    try:
        import runai_model_streamer  # noqa: F401
    except ImportError:
        pass
    try:
        fn = PEERS[name][0]
        t0 = time.perf_counter()
        tensors = fn(files)
        seconds = time.perf_counter() - t0
        del tensors
        print(json.dumps({"seconds": seconds}))
    except Exception as e:  # a peer that does not run is reported, not skipped
        print(json.dumps({"error": f"{name}: {type(e).__name__}: {e}"}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--run", metavar="NAME")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    if args.list:
        print(json.dumps([{"name": n, "same_work": same} for n, (_, same) in PEERS.items()]))
    elif args.run and args.files:
        run_once(args.run, args.files)
    else:
        sys.exit("usage: peers.py --list | peers.py --run NAME FILE...")


if __name__ == "__main__":
    main()
