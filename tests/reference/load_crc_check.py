#!/usr/bin/env python3
"""`loadstone load --json` against an independent computation.

Writes sharded checkpoints with mixed dtypes using the reference writer (safetensors 0.8.0,
numpy, ml_dtypes), loads them with the loadstone CLI with and without --dtype, and compares every
tensor's dtype, shape and CRC-32 with zlib.crc32 of the tensor converted by numpy/ml_dtypes the
way PyTorch converts (f64 to a 16-bit float goes through f32, as c10 does).

Usage: load_crc_check.py --loadstone PATH [--seed N]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import zlib

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(BF16): "BF16",
         np.dtype(np.float64): "F64", np.dtype(E4M3): "F8_E4M3", np.dtype(E5M2): "F8_E5M2",
         np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8",
         np.dtype(np.bool_): "BOOL", np.dtype(np.int8): "I8"}
FLOATS = {"F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2"}


# Scaled float8 weights: name -> (scales name, rows, cols of the block one scale covers).
FP8_SCALED = {}


def make_tensors(rng, layers):
    """A Llama-ish state dict with every dtype, small and multi-chunk tensors, no NaNs."""
    def floats(shape, dtype, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)
    t = {"model.embed_tokens.weight": floats((3000, 2304), BF16)}  # ~13 MiB: several chunks
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "attn.q_proj.weight"] = floats((384, 256), np.float16)
        t[p + "attn.k_proj.weight"] = floats((128, 256), np.float32)
        t[p + "mlp.up.weight"] = floats((512, 256), BF16)
        t[p + "mlp.fp8.weight"] = floats((64, 64), E4M3)
        t[p + "mlp.fp8_e5m2.weight"] = floats((32, 16), E5M2)
        # DeepSeek-V3 block-wise float8: 128 x 128 blocks, ragged edges, f32 scales
        t[p + "mlp.down_proj.weight"] = floats((300, 200), E4M3, 64.0)
        t[p + "mlp.down_proj.weight_scale_inv"] = (
            np.exp2(rng.integers(-14, -4, (3, 2))) * rng.uniform(1, 2, (3, 2))).astype(np.float32)
        FP8_SCALED[p + "mlp.down_proj.weight"] = (p + "mlp.down_proj.weight_scale_inv", 128, 128)
        # compressed-tensors float-quantized: per channel (bf16 scales), per tensor (0-d f32,
        # with an activation scale beside it), per group of 64 (f16), per ragged block (f32)
        def scales(shape, dtype):
            return np.asarray(np.exp2(rng.integers(-14, -4, shape)) * rng.uniform(1, 2, shape),
                              dtype=np.float32).astype(dtype)
        ct = [("mlp.gate_proj", E4M3, (96, 160), (96, 1), BF16, (1, 160)),
              ("attn.o_proj", E4M3, (64, 256), (), np.float32, (64, 256)),
              ("attn.v_proj", E5M2, (64, 256), (64, 4), np.float16, (1, 64)),
              ("mlp.experts.0.up", E4M3, (300, 200), (3, 2), np.float32, (128, 128))]
        for mod, fmt, shape, scale_shape, scale_dtype, block in ct:
            t[p + mod + ".weight"] = floats(shape, fmt, 16.0)
            t[p + mod + ".weight_scale"] = scales(scale_shape, scale_dtype)
            FP8_SCALED[p + mod + ".weight"] = (p + mod + ".weight_scale",) + block
        t[p + "attn.o_proj.input_scale"] = np.array(0.0123, dtype=np.float32)
        t[p + "input_layernorm.weight"] = floats((256,), np.float64)
        t[p + "steps"] = np.array(rng.integers(0, 1 << 40), dtype=np.int64)
        t[p + "mask"] = rng.integers(0, 2, (7, 5)).astype(np.bool_)
        t[p + "ids"] = rng.integers(-100, 100, (33,)).astype(np.int32)
        t[p + "empty"] = np.zeros((0, 3), dtype=np.float32)
    t["model.norm.weight"] = floats((256,), np.float32, 1e-3)
    t["lm_head.weight"] = floats((1000, 256), np.float16, 1e4)  # large values: f16 overflow paths
    return t


def write_sharded(folder, tensors, shard_bytes):
    os.makedirs(folder, exist_ok=True)
    shards, current, size = [], {}, 0
    for name, arr in tensors.items():
        if current and size + arr.nbytes > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = arr
        size += arr.nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(folder, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    total = sum(a.nbytes for a in tensors.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    return len(shards)


def keep_fp32(name, patterns):
    parts = name.split(".")
    for p in patterns:
        pp = p.split(".")
        if any(parts[i:i + len(pp)] == pp for i in range(len(parts))):
            return True
    return False


def expected(arr, target, keep, scale=None, block=None):
    """(dtype name, bytes) after loadstone's dtype policy, computed with numpy/ml_dtypes.
    `scale`: the scales of a float8 weight, one per `block` (rows, cols), which a load with a
    dtype dequantizes as compressed-tensors does, x_q.to(scale.dtype) * scale: the product
    rounded in the scale's dtype (DeepSeek's f32 `_scale_inv` alike); the scales themselves stay
    as stored."""
    src = NAMES[arr.dtype]
    if target is None or src not in FLOATS:
        return src, arr.tobytes()
    if scale is not None:
        grid = scale.reshape((1, 1) if scale.size == 1 else scale.shape).astype(np.float32)
        full = np.repeat(np.repeat(grid, block[0], axis=0), block[1], axis=1)
        value = arr.astype(np.float32) * full[:arr.shape[0], :arr.shape[1]]  # f32, rounded once
        value = value.astype(scale.dtype)  # x_q.to(scale.dtype) * scale: exact, then rounded
        out = {"F32": np.float32, "F16": np.float16, "BF16": BF16}["F32" if keep else target]
        return NAMES[np.dtype(out)], value.astype(out).tobytes()

    if keep and target in ("F16", "BF16"):
        target = "F32"
    if src == target:
        return src, arr.tobytes()
    as_f32 = arr.astype(np.float32)  # exact for every 16/8-bit source; RNE for f64 (as c10)
    out = {"F32": np.float32, "F16": np.float16, "BF16": BF16}[target]
    return target, as_f32.astype(out).tobytes()


def drop_cache(folder):
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_load(cli, folder, extra):
    cmd = [cli, "load", folder, "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loadstone", required=True)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"load_crc_check: seed {seed}")
    rng = np.random.default_rng(seed)
    tensors = make_tensors(rng, layers=4)
    failures = 0
    runs = [([], None, []), (["--dtype", "f32"], "F32", []), (["--dtype", "bf16"], "BF16", []),
            (["--dtype", "f16", "--keep-fp32", "input_layernorm", "--keep-fp32", "norm"], "F16",
             ["input_layernorm", "norm"]),
            (["--backend", "pread", "--dtype", "bf16"], "BF16", []),
            (["--mmap"], None, []),
            # cold (dropped from the page cache): through staging, and straight into place
            (["--staging", "8MiB"], None, []), (["--no-stage-cold"], None, []),
            (["--dtype", "f32"], "F32", [])]
    cold_from = len(runs) - 3
    with tempfile.TemporaryDirectory(prefix="loadstone-crc-") as tmp:
        folder = os.path.join(tmp, "model")
        n_shards = write_sharded(folder, tensors, shard_bytes=6 << 20)
        print(f"load_crc_check: {len(tensors)} tensors in {n_shards} shards")
        for i, (extra, target, keep) in enumerate(runs):
            if i >= cold_from:
                drop_cache(folder)
            doc = run_load(args.loadstone, folder, extra)
            if i >= cold_from and "O_DIRECT ready on" in doc["backend"] and doc["read"]["direct_bytes"] == 0:
                print(f"FAILED {extra}: a cold load read nothing with O_DIRECT: {doc['read']}")
                failures += 1
            got = {t["name"]: t for t in doc["tensors"]}
            if set(got) != set(tensors):
                print(f"FAILED {extra}: tensor names differ: {sorted(set(got) ^ set(tensors))[:5]}")
                failures += 1
                continue
            bad = 0
            for name, arr in tensors.items():
                scaled = FP8_SCALED.get(name)
                if target is not None and any(s[0] == name for s in FP8_SCALED.values()):
                    dtype, data = NAMES[arr.dtype], arr.tobytes()  # scales stay as stored
                elif scaled is not None:
                    dtype, data = expected(arr, target, keep_fp32(name, keep),
                                           tensors[scaled[0]], scaled[1:])
                else:
                    dtype, data = expected(arr, target, keep_fp32(name, keep))
                t = got[name]
                if (t["dtype"], t["shape"], t["crc32"]) != (dtype, list(arr.shape), zlib.crc32(data)):
                    bad += 1
                    if bad <= 5:
                        print(f"FAILED {extra}: {name}: loadstone {t['dtype']} {t['shape']} "
                              f"crc {t['crc32']:#010x}, expected {dtype} {list(arr.shape)} "
                              f"crc {zlib.crc32(data):#010x}")
            print(f"load_crc_check: {' '.join(extra) or '(no flags)'}: "
                  f"{len(tensors) - bad}/{len(tensors)} tensors agree ({doc['backend']})")
            failures += bad
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
