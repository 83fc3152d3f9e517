#!/usr/bin/env python3
"""Writes the many-small-tensors checkpoint of bench/README.md ("Scale with the tensor count"):
an MoE-shaped Hugging Face folder of SHARDS safetensors shards with PER_SHARD bf16 tensors each,
1-8 KiB apiece (the default 4 x 25,000 is 100,000 tensors, ~458 MB), and its index, written by
the real producer (safetensors.torch.save_file).

  make_many_tensors.py DIR [--shards 4] [--per-shard 25000] [--seed 0]

Needs torch and safetensors (any venv with them: bench/run_scale_bench.sh makes one).
"""
import argparse
import json
import os
import random

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--per-shard", type=int, default=25000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    r = random.Random(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(args.dir, exist_ok=True)
    weight_map = {}
    total = 0
    experts_per_layer = 64
    index = 0
    for shard in range(args.shards):
        name = f"model-{shard + 1:05d}-of-{args.shards:05d}.safetensors"
        tensors = {}
        for _ in range(args.per_shard):
            layer, rest = divmod(index, experts_per_layer * 3)
            expert, proj = divmod(rest, 3)
            key = f"model.layers.{layer}.mlp.experts.{expert}.{('gate', 'up', 'down')[proj]}_proj.weight"
            elements = r.randint(512, 4096)  # bf16: 1-8 KiB
            rows = r.choice([1, 2, 4, 8])
            cols = max(1, elements // rows)
            t = torch.randn(rows, cols).to(torch.bfloat16)
            tensors[key] = t
            weight_map[key] = name
            total += t.numel() * 2
            index += 1
        save_file(tensors, os.path.join(args.dir, name), metadata={"format": "pt"})
    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    print(f"{index} tensors, {total} bytes in {args.shards} shards: {args.dir}")


if __name__ == "__main__":
    main()
