#!/usr/bin/env python3
"""`loadstone convert` output, opened with the real `safetensors` library, against the producers.

For every valid PyTorch fixture (tests/fixtures/torch, made by torch.save, CRC-32s from
torch.load) and GGUF fixture without block-quantized tensors (tests/fixtures/gguf, CRC-32s from
gguf.GGUFReader): convert it, open the output with safetensors.numpy.load_file and compare each
tensor's dtype, shape and CRC-32 with the producer's. Then the casts and the streaming: convert
the same files with --dtype bf16 (and a 40 MiB safetensors checkpoint the reference wrote, so
that tensors are loaded in pieces and batches) and compare with ml_dtypes' casts of the f32
output; and a folder output with --max-shard-size, its shards and index as Hugging Face names
them, the index's weight_map covering every tensor once. Last, quantized checkpoints with
--dtype: GGUF blocks (tests/fixtures/gguf/dequant), bitsandbytes nf4/fp4/int8
(tests/fixtures/bnb, sharded included) and compressed-tensors pack-quantized weights
(tests/fixtures/ct, written as M.weight) and float-quantized (their weight_scale dropped), GPTQ and AWQ (tests/fixtures/gptq, M.qweight written as
M.weight) come out dequantized, their quant state dropped, equal bit for bit to what the producers
decode them to (the fixtures' expected*.safetensors).

Usage: convert_check.py --loadstone PATH
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import zlib

import ml_dtypes
import numpy as np
import safetensors
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
         np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float64): "F64",
         np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
         np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL",
         np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3", np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2"}
DTYPES = {v: k for k, v in NAMES.items()}
failures = []


def load_file(path):
    """The real safetensors parser (safetensors.deserialize: its Rust header checks), tensors as
    numpy arrays through ml_dtypes (safetensors.numpy has no float8)."""
    with open(path, "rb") as f:
        data = f.read()
    out = {}
    for name, t in safetensors.deserialize(data):
        out[name] = np.frombuffer(bytes(t["data"]), dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def check(ok, what):
    if not ok:
        failures.append(what)


def convert(loadstone, src, out, *flags):
    # --overwrite: the checks reuse one output path per case (a refused existing output is
    # tested in tests/tools/cli_outputs_test.cc).
    r = subprocess.run([loadstone, "convert", src, out, "--json", "--overwrite", *flags],
                       capture_output=True, text=True)
    if r.returncode != 0:
        failures.append(f"convert {src} {' '.join(flags)}: {r.stderr.strip()}")
        return None
    return json.loads(r.stdout)


def tensors_of(out):
    """Every tensor of a converted file or folder, through the real safetensors reader."""
    if out.endswith(".safetensors"):
        return load_file(out)
    index = [f for f in os.listdir(out) if ".safetensors.index" in f]
    if not index:
        (single,) = [f for f in os.listdir(out) if f.endswith(".safetensors")]
        return load_file(os.path.join(out, single))
    with open(os.path.join(out, index[0])) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        part = load_file(os.path.join(out, shard))
        for name in part:
            check(weight_map.get(name) == shard, f"{out}: {name} is in {shard}, index says "
                  f"{weight_map.get(name)}")
        tensors.update(part)
    check(set(tensors) == set(weight_map), f"{out}: index and shards list different tensors")
    return tensors


def compare(label, got, want):
    """want: [{"name", "dtype", "shape", "crc32"}] (torch manifest form)."""
    check(sorted(got) == sorted(w["name"] for w in want), f"{label}: tensor names differ")
    for w in want:
        t = got.get(w["name"])
        if t is None:
            continue
        check(NAMES.get(t.dtype) == w["dtype"], f"{label}: {w['name']} is {t.dtype}, want {w['dtype']}")
        check(list(t.shape) == w["shape"], f"{label}: {w['name']} shape {list(t.shape)}")
        check(zlib.crc32(np.ascontiguousarray(t).tobytes()) == w["crc32"],
              f"{label}: {w['name']} bytes differ from the producer's")


def check_bf16(label, f32_out, bf16_out):
    """Every float tensor of the bf16 output is ml_dtypes' RNE cast of the f32 output."""
    full, half = tensors_of(f32_out), tensors_of(bf16_out)
    for name, t in full.items():
        h = half[name]
        if t.dtype in (np.float32, np.float16, np.float64) or t.dtype == ml_dtypes.bfloat16:
            want = t.astype(np.float32).astype(ml_dtypes.bfloat16) if t.dtype != np.float64 else \
                t.astype(np.float32).astype(ml_dtypes.bfloat16)
            check(h.dtype == ml_dtypes.bfloat16, f"{label}: {name} not bf16 but {h.dtype}")
            check(np.array_equal(h.view(np.uint16), want.view(np.uint16)),
                  f"{label}: {name} bf16 bits differ from ml_dtypes' cast")
        elif t.dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
            want = t.astype(np.float32).astype(ml_dtypes.bfloat16)
            check(np.array_equal(h.view(np.uint16), want.view(np.uint16)),
                  f"{label}: {name} float8 → bf16 differs")
        else:
            check(h.dtype == t.dtype and np.array_equal(h, t), f"{label}: {name} changed")


def check_quantized(loadstone, tmp):
    """Quantized inputs converted with --dtype against the producers' decodes."""
    bnb = os.path.join(FIXTURES, "bnb")
    cases = [  # input, expected values, suffix → dtype flag, the plain tensors kept as they are
        (os.path.join(FIXTURES, "gguf", "dequant", "blocks.gguf"),
         os.path.join(FIXTURES, "gguf", "dequant", "expected.safetensors"), []),
        (os.path.join(bnb, "bnb4.safetensors"), os.path.join(bnb, "expected.safetensors"), []),
        (os.path.join(bnb, "sharded"), os.path.join(bnb, "expected.safetensors"), []),
        (os.path.join(bnb, "bnb8.safetensors"), os.path.join(bnb, "expected8.safetensors"),
         ["int8a.bias", "int8b.bias"]),
        (os.path.join(FIXTURES, "ct", "pack.safetensors"),
         os.path.join(FIXTURES, "ct", "expected.safetensors"), []),
        (os.path.join(FIXTURES, "ct", "float.safetensors"),
         os.path.join(FIXTURES, "ct", "float_expected.safetensors"), []),
    ]
    for src, expected_path, plain in cases:
        expected = load_file(expected_path)
        for suffix in ("f32", "bf16", "f16"):
            label = f"{os.path.relpath(src, FIXTURES)} --dtype {suffix}"
            out = os.path.join(tmp, "q.safetensors")
            if not convert(loadstone, src, out, "--dtype", suffix):
                continue
            got = tensors_of(out)
            weights = {k[: -len(suffix) - 1] for k in expected if k.endswith("." + suffix)}
            if os.path.basename(src) == "sharded":
                weights = {"nested.weight", "fp4.weight"}
            check(set(got) == weights | set(plain), f"{label}: tensors {sorted(got)}")
            for name in weights:
                want = expected[f"{name}.{suffix}"]
                t = got.get(name)
                check(t is not None and t.dtype == want.dtype and t.shape == want.shape and
                      np.array_equal(t.view(np.uint8), want.view(np.uint8)),
                      f"{label}: {name} differs from the producer's decode")
    # GPTQ and AWQ: one model folder a case (config.json says which), M.qweight written as
    # M.weight; the other tensors are its quant state.
    gptq = os.path.join(FIXTURES, "gptq")
    expected = load_file(os.path.join(gptq, "expected.safetensors"))
    for case in sorted(d for d in os.listdir(gptq) if os.path.isdir(os.path.join(gptq, d))):
        for suffix in ("f32", "bf16", "f16"):
            label = f"gptq/{case} --dtype {suffix}"
            out = os.path.join(tmp, "q.safetensors")
            if not convert(loadstone, os.path.join(gptq, case), out, "--dtype", suffix):
                continue
            got = tensors_of(out)
            want = expected[f"{case}.weight.{suffix}"]
            t = got.get("layer.weight")
            check(set(got) == {"layer.weight"} and t.dtype == want.dtype and
                  t.shape == want.shape and np.array_equal(t.view(np.uint8), want.view(np.uint8)),
                  f"{label}: {sorted(got)} differs from the producer's decode")
    # Without --dtype GGUF blocks would lose their type as bytes: refused.
    r = subprocess.run([loadstone, "convert", os.path.join(FIXTURES, "gguf", "dequant", "blocks.gguf"),
                        os.path.join(tmp, "refused.safetensors")], capture_output=True, text=True)
    check(r.returncode == 1 and "give --dtype" in r.stderr, f"gguf without --dtype: {r.stderr}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loadstone", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(FIXTURES, "torch", "manifest.json")) as f:
            torch_manifest = json.load(f)
        for entry in torch_manifest["valid"]:
            src = os.path.join(FIXTURES, "torch", entry["path"])
            stem = entry["path"].replace("/", "_")
            out = os.path.join(tmp, stem + ".safetensors")
            if convert(args.loadstone, src, out):
                compare(entry["path"], tensors_of(out), entry["tensors"])
            half = os.path.join(tmp, stem + ".bf16.safetensors")
            if convert(args.loadstone, src, half, "--dtype", "bf16"):
                check_bf16(entry["path"], out, half)
        with open(os.path.join(FIXTURES, "gguf", "manifest.json")) as f:
            gguf_manifest = json.load(f)
        for entry in gguf_manifest["valid"]:
            if entry["path"] == "quantized.gguf" or not entry["tensors"]:
                continue
            src = os.path.join(FIXTURES, "gguf", entry["path"])
            out = os.path.join(tmp, entry["path"].replace("/", "_") + ".safetensors")
            if not convert(args.loadstone, src, out):
                continue
            got = tensors_of(out)
            if entry["path"].startswith("split/"):  # the whole set: check this part's tensors
                got = {k: v for k, v in got.items() if k in {t["name"] for t in entry["tensors"]}}
            want = [{"name": t["name"], "dtype": t["type"], "shape": t["ne"][::-1],
                     "crc32": t["crc32"]} for t in entry["tensors"]]
            compare(entry["path"], got, want)

        # Streaming: tensors larger than a piece (16 MiB) and more bytes than a batch (32 MiB).
        rng = np.random.default_rng(5)
        big = {"embed": rng.standard_normal((2500, 2048), dtype=np.float32),  # 19.5 MiB
               "blocks.0.w": rng.standard_normal((1024, 4096), dtype=np.float32),  # 16 MiB
               "blocks.0.b": rng.standard_normal((4096,), dtype=np.float32),
               "blocks.1.w": rng.standard_normal((777, 1031)).astype(np.float16),
               "ids": rng.integers(0, 1 << 40, (1000,), dtype=np.int64)}
        src = os.path.join(tmp, "big.safetensors")
        save_file(big, src)
        f32 = os.path.join(tmp, "big.f32.safetensors")
        if convert(args.loadstone, src, f32):
            got = tensors_of(f32)
            for name, t in big.items():
                check(np.array_equal(got[name], t), f"big: {name} differs after convert")
        half = os.path.join(tmp, "big.bf16.safetensors")
        if convert(args.loadstone, src, half, "--dtype", "bf16"):
            check_bf16("big", f32, half)
        folder = os.path.join(tmp, "big-sharded")
        doc = convert(args.loadstone, src, folder, "--max-shard-size", "20MB", "--variant", "fp16",
                      "--dtype", "f16")
        if doc:
            names = sorted(os.listdir(folder))
            check("model.safetensors.index.fp16.json" in names, f"sharded: files {names}")
            shards = [n for n in names if n.endswith(".safetensors")]
            check(all(n.startswith("model.fp16-0000") and f"-of-{len(shards):05d}" in n
                      for n in shards), f"sharded: shard names {shards}")
            got = tensors_of(folder)
            for name, t in big.items():
                want = t.astype(np.float16) if t.dtype == np.float32 else t
                check(got[name].dtype == want.dtype and np.array_equal(
                    got[name].view(np.uint8), want.view(np.uint8)), f"sharded: {name} differs")
        check_quantized(args.loadstone, tmp)
    if failures:
        print("\n".join(failures))
        print(f"FAILED: {len(failures)} mismatches")
        sys.exit(1)
    print("convert output matches the producers (torch.load, gguf, ml_dtypes)")


if __name__ == "__main__":
    main()
