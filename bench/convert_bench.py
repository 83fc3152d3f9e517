#!/usr/bin/env python3
"""`loadstone convert` against the usual Python conversion, interleaved in one run.

    VENV=DIR python3 bench/convert_bench.py LOADSTONE MODEL_DIR [--rounds N] [--out FILE.json]

VENV holds torch and safetensors (pinned: PINS; tests/fixtures/make_torch_fixtures.py's venv
has both). MODEL_DIR gets a ~2 GiB float32 PyTorch checkpoint written by torch.save
(pytorch_model.bin, Llama-shaped: a 250 MiB embedding, 9 blocks) unless it is there. Each round
converts it to a bf16 safetensors folder (5 shards of at most 500 MB) with

  - loadstone: `loadstone convert MODEL OUT --dtype bf16 --max-shard-size 500MB --json`;
  - peer: torch.load(mmap=True, weights_only=True), .to(bfloat16) per tensor, and
    safetensors.torch.save_file per shard (the same split), in a fresh process,

both from a warm page cache, in alternating order, and records wall time and peak RSS
(getrusage of the child). Both do the same work: every tensor read, cast to bf16, written.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

PINS = ["torch==2.5.1", "safetensors==0.4.5", "numpy==1.26.4"]

PEER = r'''
import json, os, sys, torch
from safetensors.torch import save_file
src, out, max_shard = sys.argv[1], sys.argv[2], int(sys.argv[3])
sd = torch.load(src, mmap=True, weights_only=True)
os.makedirs(out, exist_ok=True)
shards, current, size = [], {}, 0
for name, t in sd.items():
    nbytes = t.numel() * 2
    if current and size + nbytes > max_shard:
        shards.append(current); current, size = {}, 0
    current[name] = t
    size += nbytes
shards.append(current)
index = {}
for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in shard.items()},
              os.path.join(out, fname), metadata={"format": "pt"})
    index.update({k: fname for k in shard})
json.dump({"weight_map": index}, open(os.path.join(out, "model.safetensors.index.json"), "w"))
'''


def make_model(path):
    import torch
    torch.manual_seed(0)
    sd = {"model.embed_tokens.weight": torch.randn(32000, 2048)}
    for i in range(9):
        p = f"model.layers.{i}."
        for n in ("q", "k", "v", "o"):
            sd[p + f"self_attn.{n}_proj.weight"] = torch.randn(2048, 2048)
        sd[p + "mlp.gate_proj.weight"] = torch.randn(5632, 2048)
        sd[p + "mlp.up_proj.weight"] = torch.randn(5632, 2048)
        sd[p + "mlp.down_proj.weight"] = torch.randn(2048, 5632)
        sd[p + "input_layernorm.weight"] = torch.ones(2048)
    sd["model.norm.weight"] = torch.ones(2048)
    os.makedirs(path, exist_ok=True)
    torch.save(sd, os.path.join(path, "pytorch_model.bin"))


def measured(cmd):
    """Runs `cmd` under a wrapper that reports its own child's peak RSS."""
    wrapper = ("import resource,subprocess,sys,time,json;s=time.monotonic();"
               "r=subprocess.run(sys.argv[1:],capture_output=True,text=True);"
               "t=time.monotonic()-s;"
               "print(json.dumps({'rc':r.returncode,'seconds':t,'peak':resource.getrusage("
               "resource.RUSAGE_CHILDREN).ru_maxrss*1024,'out':r.stdout,'err':r.stderr}))")
    r = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True)
    doc = json.loads(r.stdout)
    if doc["rc"] != 0:
        sys.exit(f"{cmd} failed: {doc['err']}")
    return doc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("loadstone")
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    venv = os.environ.get("VENV")
    if not venv:
        sys.exit("set VENV to a venv with " + " ".join(PINS))
    python = os.path.join(venv, "bin", "python")
    src = os.path.join(args.model, "pytorch_model.bin")
    if not os.path.exists(src):
        subprocess.check_call([python, os.path.abspath(__file__), "--make", args.model])
    size = os.path.getsize(src)
    with open(src, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    rows = []
    tmp = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(args.model)))
    try:
        for r in range(args.rounds):
            order = ["loadstone", "peer"] if r % 2 == 0 else ["peer", "loadstone"]
            for who in order:
                out = os.path.join(tmp, who)
                shutil.rmtree(out, ignore_errors=True)
                if who == "loadstone":
                    doc = measured([args.loadstone, "convert", args.model, out, "--dtype", "bf16",
                                    "--max-shard-size", "500MB", "--json"])
                    inner = json.loads(doc["out"])
                    rows.append({"round": r, "who": who, "seconds": doc["seconds"],
                                 "peak_rss_bytes": doc["peak"],
                                 "self_reported_peak_rss_bytes": inner["peak_rss_bytes"],
                                 "files": len(inner["files"]), "batches": inner["batches"]})
                else:
                    doc = measured([python, "-c", PEER, src, out, str(500_000_000)])
                    rows.append({"round": r, "who": who, "seconds": doc["seconds"],
                                 "peak_rss_bytes": doc["peak"]})
                print(json.dumps(rows[-1]), flush=True)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    def median(who, key):
        v = sorted(x[key] for x in rows if x["who"] == who)
        return v[len(v) // 2]
    summary = {"model_bytes": size, "rounds": args.rounds, "rows": rows,
               "loadstone_median_s": median("loadstone", "seconds"),
               "peer_median_s": median("peer", "seconds"),
               "loadstone_peak_rss_mib": median("loadstone", "peak_rss_bytes") / 2**20,
               "peer_peak_rss_mib": median("peer", "peak_rss_bytes") / 2**20}
    summary["speedup"] = summary["peer_median_s"] / summary["loadstone_median_s"]
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make":
        make_model(sys.argv[2])
    else:
        main()
