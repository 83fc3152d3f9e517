#!/usr/bin/env python3
"""The GPU benchmark: loading a sharded bf16 checkpoint into one GPU, loadstone against the
pinned host-to-device ceiling, safetensors, accelerate and the fastest peers.

Usage: bench.py --out RESULT.json [--size-gb 8] [--shard-gb 2] [--disk DIR] [--shm DIR]
                [--loadstone BUILD/loadstone] [--repeat 2] [--budget-s S] [--write-only]

Writes an N-GB bf16 checkpoint (tensors layers.{i}.weight [4096, 4096], shards with an index)
to the local disk and to /dev/shm, and an f32 one of the same element count to /dev/shm (for
loadstone's f32->bf16), then measures, cold (posix_fadvise DONTNEED on the files; tmpfs keeps
its pages, so shm "cold" is warm) and warm: the pinned H2D ceiling; loadstone (plain, bf16->f16,
f32->bf16) through its CLI; safetensors.torch.load_file(device="cuda:0"); accelerate's
load_checkpoint_and_dispatch(device_map="auto") on an init_empty_weights model; InstantTensor,
fastsafetensors and Run:ai's streamer when they import (a peer that does not is reported with
its error). One JSON document: every result with GB/s and ratios to the ceiling and to
safetensors from the same source and mode, rewritten after every result (a run cut short by
its time limit still leaves what it measured); with --budget-s, methods not started in time are
reported as skipped. The checkpoint writer and the argument parsing need neither torch nor a GPU.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
import traceback

ROWS, COLS = 4096, 4096
DTYPE_BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}
BLOCK = 128  # DeepSeek-V3 float8 weights: one f32 `_scale_inv` per 128 x 128 block


# ---- checkpoint ---------------------------------------------------------------------------

def write_checkpoint(folder, total_bytes, dtype, shard_bytes):
    """Writes model-0000k-of-0000n.safetensors + model.safetensors.index.json; returns files."""
    tensor_bytes = ROWS * COLS * DTYPE_BYTES[dtype]
    n_tensors = max(1, total_bytes // tensor_bytes)
    per_shard = max(1, shard_bytes // tensor_bytes)
    n_shards = (n_tensors + per_shard - 1) // per_shard
    marker = os.path.join(folder, ".complete")
    stamp = f"{dtype} {n_tensors} {per_shard}"
    if os.path.exists(marker) and open(marker).read() == stamp:
        return sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    pool = os.urandom(2 * tensor_bytes)  # tensors are windows of one random pool
    weight_map, files = {}, []
    for s in range(n_shards):
        name = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        first, last = s * per_shard, min(n_tensors, (s + 1) * per_shard)
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        scale_bytes = (ROWS // BLOCK) * (COLS // BLOCK) * 4
        for i in range(first, last):
            header[f"layers.{i}.weight"] = {"dtype": dtype, "shape": [ROWS, COLS],
                                            "data_offsets": [offset, offset + tensor_bytes]}
            weight_map[f"layers.{i}.weight"] = name
            offset += tensor_bytes
            if dtype == "F8_E4M3":
                header[f"layers.{i}.weight_scale_inv"] = {
                    "dtype": "F32", "shape": [ROWS // BLOCK, COLS // BLOCK],
                    "data_offsets": [offset, offset + scale_bytes]}
                weight_map[f"layers.{i}.weight_scale_inv"] = name
                offset += scale_bytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for i in range(first, last):
                start = (i * 4099 * 64) % tensor_bytes
                f.write(memoryview(pool)[start:start + tensor_bytes])
                if dtype == "F8_E4M3":
                    f.write(struct.pack("<f", 2.0 ** -8) * (scale_bytes // 4))
        files.append(path)
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": n_tensors * tensor_bytes},
                   "weight_map": weight_map}, f)
    with open(marker, "w") as f:
        f.write(stamp)
    return files


def drop_cache(files):
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ---- methods (each loads every tensor onto cuda:0 and returns when the GPU has it) --------

def pinned_ceiling(torch, gib=1, repeat=5):
    n = gib << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rates = []
    for _ in range(repeat):
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        rates.append(n / (start.elapsed_time(end) / 1e3) / 1e9)
    del host, dev
    return {"gbps": max(rates), "gbps_all": rates, "bytes": n}


def m_safetensors(torch, files, folder):
    from safetensors.torch import load_file
    out = {}
    for f in files:
        out.update(load_file(f, device="cuda:0"))
    return out


def m_accelerate(torch, files, folder):
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    n = len(json.load(open(os.path.join(folder, "model.safetensors.index.json")))["weight_map"])

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(COLS, ROWS, bias=False) for _ in range(n))

    with init_empty_weights():
        model = Model()
    return load_checkpoint_and_dispatch(model, folder, device_map="auto",
                                        dtype=torch.bfloat16)


def m_instanttensor(torch, files, folder):
    from instanttensor import safe_open
    out = {}
    with safe_open(files, framework="pt", device=0) as f:
        for name, tensor in f.tensors():
            out[name] = tensor
    return out


def m_fastsafetensors(torch, files, folder):
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup
    loader = SafeTensorsFileLoader(SingleGroup(), "cuda:0", nogds=True)
    try:
        loader.add_filenames({0: files})
        fb = loader.copy_files_to_device()
        out = {k: fb.get_tensor(k).clone() for k in loader.get_keys()}
        fb.close()
        return out
    finally:
        loader.close()


def m_runai(torch, files, folder):
    from runai_model_streamer import SafetensorsStreamer
    out = {}
    with SafetensorsStreamer() as s:
        s.stream_files(files)
        for name, tensor in s.get_tensors():
            out[name] = tensor.to("cuda:0", non_blocking=True)
    return out


def loadstone_cli(binary, dtype):
    def run(torch, files, folder):
        cmd = [binary, "load", folder, "--device-map", "cuda:0", "--json"]
        if dtype:
            cmd += ["--dtype", dtype]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-600:]}")
        doc = json.loads(p.stdout)
        doc.pop("tensors", None)
        return {"loadstone": doc}
    return run


# ---- driver -------------------------------------------------------------------------------

def measure(torch, fn, files, folder, cold, repeat):
    times, extra = [], None
    for _ in range(repeat):
        if cold:
            drop_cache(files)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(torch, files, folder)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if isinstance(out, dict) and "loadstone" in out:
            extra = out["loadstone"]
        del out
        torch.cuda.empty_cache()
    return times, extra


def write_doc(doc, path):
    """Writes the results so far (ratios to safetensors included), replacing the file whole."""
    base = {(r["source"], r["mode"]): r.get("gbps") for r in doc["results"]
            if r["method"] == "safetensors-load_file-cuda"}
    for r in doc["results"]:
        b = base.get((r["source"].replace("-f32", ""), r["mode"]))
        if r.get("gbps") and b:
            r["ratio_vs_safetensors"] = r["gbps"] / b
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(path + ".tmp", path)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="where the JSON document goes")
    ap.add_argument("--size-gb", type=float, default=8.0)
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--disk", default="/var/tmp/loadstone-bench")
    ap.add_argument("--shm", default="/dev/shm/loadstone-bench")
    ap.add_argument("--loadstone", default="build/loadstone")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no measurement after this many seconds (they are reported skipped)")
    ap.add_argument("--write-only", action="store_true", help="write the checkpoints and stop")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    total, shard = int(args.size_gb * 1e9), int(args.shard_gb * 1e9)
    doc = {"size_gb": args.size_gb, "checkpoints": {}, "results": []}
    t0 = time.perf_counter()
    ckpts = {
        "disk": (os.path.join(args.disk, "bf16"), "BF16"),
        "shm": (os.path.join(args.shm, "bf16"), "BF16"),
        "shm-f32": (os.path.join(args.shm, "f32"), "F32"),
        "shm-fp8": (os.path.join(args.shm, "fp8"), "F8_E4M3"),
    }
    files = {}
    for key, (folder, dtype) in ckpts.items():
        files[key] = write_checkpoint(folder, total, dtype, shard)
        doc["checkpoints"][key] = {"folder": folder, "dtype": dtype, "files": len(files[key]),
                                   "bytes": sum(os.path.getsize(f) for f in files[key])}
    doc["write_seconds"] = time.perf_counter() - t0
    if args.write_only:
        print(json.dumps(doc, indent=2))
        return 0

    if not os.access(args.loadstone, os.X_OK):  # its runs would all fail the same way
        doc["loadstone_error"] = f"no loadstone binary at {args.loadstone} (--loadstone)"
        print(doc["loadstone_error"], file=sys.stderr)
    write_doc(doc, args.out)
    import torch
    doc["torch"] = torch.__version__
    doc["gpu"] = torch.cuda.get_device_name(0)
    doc["ceiling"] = pinned_ceiling(torch)
    ceiling = doc["ceiling"]["gbps"]
    write_doc(doc, args.out)

    methods = [
        ("loadstone", loadstone_cli(args.loadstone, None), ["disk", "shm", "shm-fp8"]),
        ("loadstone-bf16-to-f16", loadstone_cli(args.loadstone, "f16"), ["shm"]),
        ("loadstone-f32-to-bf16", loadstone_cli(args.loadstone, "bf16"), ["shm-f32"]),
        # the float8 weights times their block scales, into bf16 (vs "loadstone" on shm-fp8)
        ("loadstone-fp8-block-to-bf16", loadstone_cli(args.loadstone, "bf16"), ["shm-fp8"]),
        ("safetensors-load_file-cuda", m_safetensors, ["disk", "shm"]),
        ("instanttensor", m_instanttensor, ["disk", "shm"]),
        ("fastsafetensors", m_fastsafetensors, ["disk", "shm"]),
        ("runai-model-streamer", m_runai, ["disk", "shm"]),
        ("accelerate-load_checkpoint_and_dispatch", m_accelerate, ["disk", "shm"]),
    ]
    for name, fn, sources in methods:
        for source in sources:
            for mode in ("cold", "warm"):
                entry = {"method": name, "source": source, "mode": mode}
                folder = ckpts[source][0]
                if args.budget_s is not None and time.perf_counter() - t0 > args.budget_s:
                    entry["skipped"] = f"out of time (--budget-s {args.budget_s:g})"
                    doc["results"].append(entry)
                    continue
                try:
                    times, extra = measure(torch, fn, files[source], folder, mode == "cold",
                                           args.repeat)
                    nbytes = doc["checkpoints"][source]["bytes"]
                    entry.update(seconds=times, gbps=nbytes / statistics.median(times) / 1e9)
                    entry["ratio_vs_ceiling"] = entry["gbps"] / ceiling
                    if extra is not None:
                        entry["loadstone_json"] = extra
                except Exception as e:  # a peer that does not run is reported, not skipped
                    entry["error"] = f"{type(e).__name__}: {e}"
                    entry["traceback"] = traceback.format_exc()[-1500:]
                doc["results"].append(entry)
                print(json.dumps({k: entry.get(k) for k in
                                  ("method", "source", "mode", "gbps", "error")}),
                      file=sys.stderr, flush=True)
                write_doc(doc, args.out)
    write_doc(doc, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
