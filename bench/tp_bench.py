#!/usr/bin/env python3
"""Tensor-parallel loading on this machine (issue 33's Must-show; docs/distributed.md):

    python3 bench/tp_bench.py [--model DIR] [--ranks 4] [--rounds 3] [--out FILE]

N ranks on 127.0.0.1 (`loadstone launch -n N`), cold (each model file's pages dropped with
posix_fadvise(DONTNEED) before every run), in one shuffled loop of rounds:
  - split: `load MODEL --tp N` — each rank reads only its parts, row-wise parts exchanged over
    Gloo;
  - whole: `load MODEL` on every rank — each rank reads the whole model, what engines do today;
  - once: `load MODEL --tp N --read-once` — rank 0 reads the model once and sends every other
    rank its parts over Gloo.
The time is the launcher's wall time, from start to every rank loaded (process start and the
rendezvous included). One more split run with --json (not timed: it computes every part's
CRC-32) gives each rank's bytes: the reads must add up to at most (split bytes + N × replicated
bytes) × 1.01 and no rank may read more than 1.1 × the mean; one read-once run with --json must
read exactly the model's bytes in all; one `--read-mode auto` run with --json records what the
group measured, the cost model's estimates and the mode it took.

The model is the 40-layer synthetic Llama of bench/run_cpu_bench.sh (made once by
`loadstone demo --layers 40`); it has no config.json, so the plan is given: transformers' own plan
for a Llama causal LM (what `TpPlanFromConfig` gives for model_type llama).
"""
import argparse
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA_PLAN = {
    "lm_head": "colwise_gather_output",
    "model.embed_tokens": "embedding_rowwise",
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.k_proj": "colwise",
    "model.layers.*.self_attn.v_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.gate_proj": "colwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": "rowwise",
}


def drop_cache(model):
    for name in sorted(os.listdir(model)):
        if name.endswith(".safetensors"):
            fd = os.open(os.path.join(model, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def launch(cli, ranks, args, timeout=600):
    cmd = [cli, "launch", "-n", str(ranks), "--timeout", str(timeout), "--"] + args
    start = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 60)
    seconds = time.monotonic() - start
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.stderr[-2000:]}")
    return seconds, run.stdout


def report(result, out):
    """Prints `result` as JSON, and writes it to `out` (when given) whole: beside, then renamed."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with open(out + ".tmp", "w") as f:
            f.write(text + "\n")
        os.replace(out + ".tmp", out)


def timed_rounds(cli, ranks, model, modes, rounds):
    """{mode: [seconds, ...]}: every mode's launch once a round, in a shuffled order, cold."""
    times = {mode: [] for mode in modes}
    for _ in range(rounds):
        order = list(modes)
        random.shuffle(order)
        for mode in order:
            drop_cache(model)
            seconds, _ = launch(cli, ranks, modes[mode])
            times[mode].append(seconds)
            print(f"{mode}: {seconds:.2f} s", file=sys.stderr)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/var/tmp/loadstone-bench-llama40")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cli", default=os.path.join(ROOT, "build", "loadstone"))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not os.path.exists(a.model):
        subprocess.run([a.cli, "demo", "--layers", "40", "--dir", a.model], check=True,
                       stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "tp_plan.json")
        with open(plan, "w") as f:
            json.dump(LLAMA_PLAN, f)
        split = ["load", a.model, "--tp", str(a.ranks), "--tp-plan", plan]
        modes = {"split": split, "whole": ["load", a.model], "once": split + ["--read-once"]}
        times = timed_rounds(a.cli, a.ranks, a.model, modes, a.rounds)
        documents = {}
        for mode, extra in (("split", []), ("once", ["--read-once"]),
                            ("auto", ["--read-mode", "auto"])):
            drop_cache(a.model)
            _, out = launch(a.cli, a.ranks, split + extra + ["--json"])
            documents[mode] = json.loads(out)["ranks"]
    docs = documents["split"]
    once = documents["once"]
    auto = documents["auto"]
    requested = [d["requested_bytes"] for d in docs]
    from_storage = [d["read_bytes"] for d in docs]
    bound = (docs[0]["split_bytes"] + a.ranks * docs[0]["replicated_bytes"]) * 1.01
    mean = statistics.mean(requested)
    result = {
        "date": datetime.date.today().isoformat(),
        "model": a.model,
        "ranks": a.ranks,
        "rounds": a.rounds,
        "machine": {"cpus": os.cpu_count()},
        "seconds": times,
        "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "speedup_whole_over_split": statistics.median(times["whole"]) /
                                    statistics.median(times["split"]),
        "speedup_whole_over_once": statistics.median(times["whole"]) /
                                   statistics.median(times["once"]),
        "split_bytes": docs[0]["split_bytes"],
        "replicated_bytes": docs[0]["replicated_bytes"],
        "requested_bytes": requested,
        "read_bytes_from_storage": from_storage,
        "received_bytes": [d["received_bytes"] for d in docs],
        "reads_bound": bound,
        "reads_within_bound": sum(requested) <= bound,
        "storage_reads_within_bound": sum(from_storage) <= bound,
        "max_over_mean": max(requested) / mean,
        "once": {
            "requested_bytes": [d["requested_bytes"] for d in once],
            "model_bytes": once[0]["split_bytes"] + once[0]["replicated_bytes"],
            "reads_model_once": sum(d["requested_bytes"] for d in once) ==
                                once[0]["split_bytes"] + once[0]["replicated_bytes"],
            "received_bytes": [d["received_bytes"] for d in once],
            "load_seconds": [d["load_seconds"] for d in once],
            "exchange_seconds": [d["exchange_seconds"] for d in once],
        },
        "auto": {k: auto[0][k] for k in ("read_mode", "measured_read_bytes_per_s",
                                         "measured_link_bytes_per_s", "estimated_each_seconds",
                                         "estimated_once_seconds", "probe_bytes")},
        "split_load_seconds": [d["load_seconds"] for d in docs],
        "split_exchange_seconds": [d["exchange_seconds"] for d in docs],
    }
    report(result, a.out)


if __name__ == "__main__":
    main()
