#!/usr/bin/env python3
"""Dequantize-on-load against the plain load of the same bytes, cold, in one interleaved run
(bench/README.md, "Quantized checkpoints"):

    python3 bench/quant_bench.py [--dir /var/tmp/loadstone-quant-bench] [--rounds 3] [--out FILE]

Makes (once, in --dir) two ~2 GiB checkpoints of 4096 x 4096 weights: `nf4/` as transformers
saves bitsandbytes nf4 Linear4bit weights (packed bytes, absmax, quant_map and quant state; the
quant_map and the state's form from bitsandbytes' own quantize_4bit, the codes and absmax random)
and `q4k.gguf` (gguf.GGUFWriter, Q4_K blocks of random bytes with finite f16 scales). Then, each
round in a fresh random order, `loadstone bench MODEL --cold --repeat 1 --json --dtype bf16` with
and without --keep-packed: the dequantizing load and the plain load of the same bytes, each run
beside bench's own baselines (raw-ceiling: the same bytes read cold into reused buffers;
first-touch: the bound of writing the output once). Prints and writes (bench/results/
quant-DATE.json unless --out) the medians and ratios. Generation re-runs itself in a venv
holding PINS (build/bench-venv unless --venv).
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
sys.path.insert(0, os.path.join(REPO, "tests", "fixtures"))
from fixture_venv import run_in_venv  # noqa: E402

PINS = ["torch==2.5.1", "bitsandbytes==0.48.2", "numpy==1.26.4", "safetensors==0.4.5",
        "gguf==0.17.1"]
ROWS = COLS = 4096
WEIGHTS = 256            # nf4: 8 MiB of codes each, 2 GiB in all
Q4K_WEIGHTS = 228        # Q4_K: 9 MiB each (144 bytes a 256-element block), ~2 GiB


def make_nf4(folder):
    import torch
    import bitsandbytes.functional as F
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    _, state = F.quantize_4bit(torch.randn(4096), blocksize=64, quant_type="nf4")
    doc = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [ROWS, COLS]}
    qs = torch.tensor(list(json.dumps(doc).encode()), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(4)
    per_file, weight_map, total = 64, {}, 0
    for f in range(WEIGHTS // per_file):
        tensors = {}
        for i in range(f * per_file, (f + 1) * per_file):
            w = f"model.layers.{i}.proj.weight"
            tensors[w] = torch.randint(0, 256, (ROWS * COLS // 2, 1), dtype=torch.uint8, generator=gen)
            tensors[w + ".absmax"] = torch.rand(ROWS * COLS // 64, generator=gen) + 0.01
            tensors[w + ".quant_map"] = state.code.clone()
            tensors[w + ".quant_state.bitsandbytes__nf4"] = qs.clone()
        name = f"model-{f + 1:05d}-of-{WEIGHTS // per_file:05d}.safetensors"
        save_file(tensors, os.path.join(folder, name), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def make_q4k(path):
    import gguf
    import numpy as np

    rng = np.random.default_rng(5)
    writer = gguf.GGUFWriter(path, "loadstone-quant-bench")
    blocks_per_row = COLS // 256
    for i in range(Q4K_WEIGHTS):
        raw = rng.integers(0, 256, size=(ROWS * blocks_per_row, 144), dtype=np.uint8)
        for at in (0, 2):  # d, dmin: finite halves
            halves = rng.uniform(-1, 1, size=ROWS * blocks_per_row).astype(np.float16)
            raw[:, at:at + 2] = halves.view(np.uint8).reshape(-1, 2)
        writer.add_tensor(f"blk.{i}.ffn.weight", raw.reshape(ROWS, blocks_per_row * 144),
                          raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def bench(loadstone, model, packed):
    cmd = [loadstone, "bench", model, "--cold", "--repeat", "1", "--json", "--dtype", "bf16"]
    if packed:
        cmd.append("--keep-packed")
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    doc = json.loads(r.stdout)
    return {m["method"]: m["seconds"][0] for m in doc["results"]}, doc["bytes"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/var/tmp/loadstone-quant-bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out")
    parser.add_argument("--venv", default=os.path.join(REPO, "build", "bench-venv"))
    parser.add_argument("--loadstone", default=os.path.join(REPO, "build", "loadstone"))
    args = parser.parse_args()
    nf4, q4k = os.path.join(args.dir, "nf4"), os.path.join(args.dir, "q4k.gguf")
    if not os.path.exists(os.path.join(nf4, "model.safetensors.index.json")) or not os.path.exists(q4k):
        run_in_venv(args.venv, PINS)
        os.makedirs(args.dir, exist_ok=True)
        if not os.path.exists(os.path.join(nf4, "model.safetensors.index.json")):
            make_nf4(nf4)
        if not os.path.exists(q4k):
            make_q4k(q4k)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    rng = random.Random(seed)
    runs = [(name, model, packed) for name, model in (("nf4", nf4), ("q4k", q4k))
            for packed in (False, True)]
    seconds = {}
    sizes = {}
    for _ in range(args.rounds):
        rng.shuffle(runs)
        for name, model, packed in runs:
            times, size = bench(args.loadstone, model, packed)
            sizes[name] = size
            key = f"{name}/{'packed' if packed else 'dequant'}"
            for method, s in times.items():
                seconds.setdefault(f"{key}/{method}", []).append(s)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    ratios = {}
    for name in ("nf4", "q4k"):
        d, p = med[f"{name}/dequant/loadstone"], med[f"{name}/packed/loadstone"]
        ratios[name] = {
            "dequant_over_packed_time": d / p,
            "dequant_over_raw_ceiling_time": d / med[f"{name}/dequant/raw-ceiling"],
            "dequant_input_gbps": sizes[name] / d / 1e9,
            "packed_input_gbps": sizes[name] / p / 1e9,
        }
    doc = {"date": datetime.date.today().isoformat(), "seed": seed, "rounds": args.rounds,
           "bytes": sizes, "median_seconds": med, "samples": seconds, "ratios": ratios}
    out = args.out or os.path.join(REPO, "bench", "results",
                                   f"quant-{datetime.date.today().isoformat()}.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    for name, r in ratios.items():
        print(f"{name}: dequantizing load {r['dequant_input_gbps']:.2f} GB/s of input, "
              f"{r['dequant_over_packed_time']:.2f}x the time of the plain load "
              f"({r['packed_input_gbps']:.2f} GB/s), "
              f"{r['dequant_over_raw_ceiling_time']:.2f}x the raw cold read")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
