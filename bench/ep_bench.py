#!/usr/bin/env python3
"""Expert-parallel loading on this machine (issue 33; docs/distributed.md, "Expert parallelism"):

    python3 bench/ep_bench.py [--model DIR] [--ranks 4] [--rounds 2] [--out FILE]

N ranks on 127.0.0.1 (`loadstone launch -n N`), cold (the model's pages dropped before every
run, as bench/tp_bench.py), in one shuffled loop of rounds:
  - ep: `load MODEL --tp N --ep` — each rank reads its part of the dense weights and only its
    experts (E/N of every layer's);
  - tp: `load MODEL --tp N` — the same without --ep: the experts replicated, every rank reads all
    of them (what a tensor-parallel load of a MoE model without expert parallelism reads).
The time is the launcher's wall time to every rank loaded. One more run of each with --json
gives each rank's bytes.

The model is a synthetic Qwen3-MoE-shaped checkpoint written once (--model, default
/var/tmp/loadstone-bench-moe): config.json of model_type qwen3_moe (loadstone's built-in tp and ep
plans for it), 8 layers of hidden size 1024, 64 experts of 768 each stored one tensor per
expert, bf16, 2.4 GB; its bytes are pseudo-random (not zeros: nothing sparse or compressible).
"""
import argparse
import datetime
import json
import os
import statistics
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tp_bench import drop_cache, launch, report, timed_rounds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H, I, E, L, VOCAB, HEADS, KV = 1024, 768, 64, 8, 32000, 16, 4


def tensors():
    """(name, shape) of the checkpoint, in the order written."""
    d = H // HEADS
    yield "model.embed_tokens.weight", [VOCAB, H]
    for l in range(L):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", [H]
        yield p + "post_attention_layernorm.weight", [H]
        yield p + "self_attn.q_proj.weight", [HEADS * d, H]
        yield p + "self_attn.k_proj.weight", [KV * d, H]
        yield p + "self_attn.v_proj.weight", [KV * d, H]
        yield p + "self_attn.o_proj.weight", [H, HEADS * d]
        yield p + "self_attn.q_norm.weight", [d]
        yield p + "self_attn.k_norm.weight", [d]
        yield p + "mlp.gate.weight", [E, H]
        for e in range(E):
            yield p + f"mlp.experts.{e}.gate_proj.weight", [I, H]
            yield p + f"mlp.experts.{e}.up_proj.weight", [I, H]
            yield p + f"mlp.experts.{e}.down_proj.weight", [H, I]
    yield "model.norm.weight", [H]
    yield "lm_head.weight", [VOCAB, H]


def write_model(folder):
    os.makedirs(folder, exist_ok=True)
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
              "hidden_size": H, "moe_intermediate_size": I, "num_hidden_layers": L,
              "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": H // HEADS,
              "num_local_experts": E, "num_experts_per_tok": 8, "vocab_size": VOCAB,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    header, offset = {}, 0
    for name, shape in tensors():
        n = 2
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    block = os.urandom(1 << 20)
    path = os.path.join(folder, "model.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        left = offset
        while left > 0:
            f.write(block[:min(left, len(block))])
            left -= min(left, len(block))
    os.replace(path + ".tmp", path)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/var/tmp/loadstone-bench-moe")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "loadstone"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.model, "model.safetensors")):
        write_model(a.model)
    base = ["load", a.model, "--tp", str(a.ranks)]
    modes = {"ep": base + ["--ep"], "tp": base}
    times = timed_rounds(a.cli, a.ranks, a.model, modes, a.rounds)
    docs = {}
    for mode, args in modes.items():
        drop_cache(a.model)
        _, out = launch(a.cli, a.ranks, args + ["--json"])
        docs[mode] = json.loads(out)["ranks"]
    ep, tp = docs["ep"], docs["tp"]
    result = {
        "date": datetime.date.today().isoformat(),
        "model": a.model,
        "model_bytes": os.path.getsize(os.path.join(a.model, "model.safetensors")),
        "ranks": a.ranks,
        "rounds": a.rounds,
        "machine": {"cpus": os.cpu_count()},
        "seconds": times,
        "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "speedup_ep_over_tp": statistics.median(times["tp"]) / statistics.median(times["ep"]),
        "ep": {"requested_bytes": [d["requested_bytes"] for d in ep],
               "expert_bytes": ep[0]["expert_bytes"], "split_bytes": ep[0]["split_bytes"],
               "replicated_bytes": ep[0]["replicated_bytes"],
               "tensors": [len(d["tensors"]) for d in ep],
               "reads_sum": sum(d["requested_bytes"] for d in ep),
               "reads_bound": ep[0]["split_bytes"] + a.ranks * ep[0]["replicated_bytes"]},
        "tp": {"requested_bytes": [d["requested_bytes"] for d in tp],
               "tensors": [len(d["tensors"]) for d in tp],
               "reads_sum": sum(d["requested_bytes"] for d in tp)},
    }
    result["ep"]["reads_within_bound"] = result["ep"]["reads_sum"] <= result["ep"]["reads_bound"]
    report(result, a.out)


if __name__ == "__main__":
    main()
