#!/usr/bin/env python3
"""The Python drop-ins against the libraries they replace (issue 31; bench/README.md):

  bench/python_bench.py [--cases load_file,shards,diffusers,dispatch] [--mode cold,warm]
                        [--rounds 3] [--seed N] [--settle 1] [--python PYTHON]
                        [--workdir /var/tmp/loadstone-pybench] [--model BENCH_MODEL_DIR]
                        [--json OUT] [--small] [--remove-models]

Cases (methods in brackets; the first of each is loadstone's, the baseline is marked *):
  load_file  one >= 1 GiB bf16 safetensors file (made once in --workdir, Llama-shaped tensors):
             [loadstone.torch.load_file, *safetensors load_file + clone of every tensor,
              safetensors load_file + one byte per 4 KiB page of every tensor touched]
  shards     each shard of the 3.6 GiB bench model (`loadstone demo --layers 40`, --model), loaded
             one shard a process: the same three methods
  diffusers  UNet2DConditionModel with Stable Diffusion 1.5's UNet config, random init, saved
             once with save_pretrained in float16 (1.6 GiB): [from_pretrained(torch_dtype=
             float16) inside loadstone.patch_diffusers(), *stock from_pretrained]
  dispatch   LlamaForCausalLM (hidden 2048, 10 layers, bf16, 1.2 GiB) saved once with
             save_pretrained; the skeleton built under accelerate.init_empty_weights() before
             the clock: [loadstone.torch.load_checkpoint_and_dispatch (writing NAME.dat files,
             as accelerate does), *accelerate.load_checkpoint_and_dispatch, loadstone with
             offload_in_place=True (disk tensors referenced in their safetensors file, nothing
             written: less work, listed apart)], all with device_map="auto",
             max_memory={"cpu": half the model's bytes}, a fresh offload folder,
             no_split_module_classes=["LlamaDecoderLayer"]

How it measures: every timed run is a fresh process (`--python`, default this interpreter; the
import path is the environment's), which imports everything it needs, resets its peak RSS
(/proc/self/clear_refs 5), reads VmRSS, then times only the work and prints one JSON line:
seconds, peak RSS over that baseline (VmHWM - VmRSS), and after the clock a digest of what it
loaded (CRC-32 of every tensor's bytes) that the parent compares across methods. Each round runs
every (case, file, mode, method) once in one shuffled order (seeded: the seed is printed); before
each run: cold = every file of the checkpoint fdatasync'ed and dropped from the page cache
(posix_fadvise DONTNEED; mincore says what is left), warm = every file read through the page
cache; then --settle seconds of quiet. Medians, min and max per method; ratios are median over
median within this run. Runs where a result is a lazy mmap view (safetensors, stock diffusers,
accelerate's CPU weights) also report the time with one byte of every 4 KiB page touched, which
is the time the ratios use where the targets ask for the same work; the call alone is listed too.

--small shrinks every generated model to a few MB (for trying the script; the sizes then fall
short of the issue's targets, and the report says so). Generated models are kept in --workdir
(each folder marked as made by this script) and reused; --remove-models deletes them at the end.
The parent needs only the standard library; the children need torch, safetensors, loadstone
and, per case, diffusers or transformers + accelerate.
"""
import argparse
import ctypes
import datetime
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MARKER = ".made-by-python_bench"
MiB = 1 << 20
GiB = 1 << 30
PAGE = 4096

# ---------------------------------------------------------------------------------------------
# What is measured
# ---------------------------------------------------------------------------------------------

# case -> [(method id, label)]; the loadstone method first, then the baseline the ratios use.
METHODS = {
    "load_file": [
        ("loadstone", "loadstone.torch.load_file"),
        ("st_clone", "safetensors.torch.load_file + .clone() of every tensor"),
        ("st_touch", "safetensors.torch.load_file + one byte/page touched (mmap views)"),
    ],
    "diffusers": [
        ("patched", "from_pretrained inside loadstone.patch_diffusers()"),
        ("stock", "from_pretrained, stock diffusers"),
    ],
    "dispatch": [
        ("loadstone", "loadstone.torch.load_checkpoint_and_dispatch (NAME.dat, as accelerate)"),
        ("accelerate", "accelerate.load_checkpoint_and_dispatch"),
        ("loadstone_in_place", "loadstone ... offload_in_place=True (disk tensors referenced)"),
    ],
}
METHODS["shards"] = METHODS["load_file"]

# (case, loadstone method, baseline method, mode) -> minimum ratio baseline/loadstone
TARGETS = {
    ("load_file", "warm"): 1.5, ("load_file", "cold"): 2.0,
    ("shards", "warm"): 1.5, ("shards", "cold"): 2.0,
    ("diffusers", "warm"): 1.0, ("diffusers", "cold"): 1.5,
    ("dispatch", "warm"): 2.0, ("dispatch", "cold"): 2.0,
}
BASELINE = {"load_file": "st_clone", "shards": "st_clone", "diffusers": "stock",
            "dispatch": "accelerate"}
LOADSTONE = {"load_file": "loadstone", "shards": "loadstone", "diffusers": "patched",
             "dispatch": "loadstone"}

# Stable Diffusion 1.5's UNet (runwayml/stable-diffusion-v1-5, unet/config.json): 860M parameters.
SD15_UNET = {
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                         "DownBlock2D"],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D",
                       "CrossAttnUpBlock2D"],
}
# --small: the tiny UNet of diffusers' own tests (same blocks, a few MB).
TINY_UNET = {
    "block_out_channels": [32, 64],
    "layers_per_block": 2,
    "sample_size": 32,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
    "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
    "cross_attention_dim": 32,
    "attention_head_dim": 8,
    "norm_num_groups": 32,
}
# Llama shapes (Llama-2-style, no GQA) for the single bf16 file and the dispatch model.
LLAMA = {"hidden": 2048, "intermediate": 5632, "heads": 16, "vocab": 32000, "layers": 10}
TINY_LLAMA = {"hidden": 256, "intermediate": 688, "heads": 4, "vocab": 2000, "layers": 2}


# ---------------------------------------------------------------------------------------------
# Child side: one timed run in a fresh process (imports before the clock)
# ---------------------------------------------------------------------------------------------

def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return None


def _reset_peak():
    """Resets VmHWM to the current RSS and returns (VmRSS, whether the reset worked)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = True
    except OSError:
        reset = False
    return _status_kib("VmRSS"), reset


def _touch(tensors):
    """Reads one byte of every 4 KiB page of every CPU tensor (and its last byte), so that a lazy
    mmap view is made resident; returns a checksum so that nothing is optimized away."""
    import torch

    total = 0
    for t in tensors:
        if t.device.type != "cpu" or t.numel() == 0:
            continue
        u8 = t.detach().reshape(-1).view(torch.uint8)
        total += int(u8[::PAGE].sum()) + int(u8[-1])
    return total


def _digest(named):
    """sha256 over (name, dtype, shape, CRC-32 of the bytes) of every tensor, by name; and the
    per-tensor CRCs, which name the first tensor that differs when digests disagree."""
    import zlib

    import torch

    h = hashlib.sha256()
    crcs = {}
    for name, t in sorted(named, key=lambda kv: kv[0]):
        b = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        crc = zlib.crc32(b)
        crcs[name] = crc
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|{crc:08x}\n".encode())
    return h.hexdigest(), crcs


def _nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def child_load_file(spec):
    import safetensors.torch
    import torch  # noqa: F401

    import loadstone.torch

    path, method = spec["files"][0], spec["method"]
    baseline, reset = _reset_peak()
    t0 = time.perf_counter()
    if method == "loadstone":
        sd = loadstone.torch.load_file(path)
        t1 = t2 = time.perf_counter()
    elif method == "st_clone":
        sd = {k: v.clone() for k, v in safetensors.torch.load_file(path).items()}
        t1 = t2 = time.perf_counter()
    elif method == "st_touch":
        sd = safetensors.torch.load_file(path)
        t1 = time.perf_counter()
        _touch(sd.values())
        t2 = time.perf_counter()
    else:
        raise ValueError(method)
    peak = _status_kib("VmHWM")
    digest, crcs = _digest(sd.items())
    return {"seconds": t2 - t0, "seconds_call": t1 - t0, "peak_rss": peak - baseline,
            "baseline_rss": baseline, "peak_reset": reset, "tensors": len(sd),
            "bytes": _nbytes(sd.values()), "digest": digest, "crcs": crcs}


def child_diffusers(spec):
    import diffusers
    import diffusers.models.model_loading_utils  # noqa: F401  (what the patch replaces)
    import torch

    import loadstone
    import loadstone.torch  # noqa: F401  (the patch imports it on first use: not in the time)

    cls = getattr(diffusers, spec["class"])
    dtype = getattr(torch, spec["dtype"])
    # Counts the files the patch hands to loadstone (so the report can say the patch took
    # effect): the patched load_state_dict looks _state_dict up in loadstone._patches per call.
    import loadstone._patches as patches

    read_by_loadstone = []
    state_dict_of = patches._state_dict

    def counting(checkpoint_file, map_location):
        read_by_loadstone.append(os.fspath(checkpoint_file))
        return state_dict_of(checkpoint_file, map_location)

    patches._state_dict = counting
    baseline, reset = _reset_peak()
    t0 = time.perf_counter()
    if spec["method"] == "patched":
        with loadstone.patch_diffusers():
            model = cls.from_pretrained(spec["dir"], torch_dtype=dtype)
    elif spec["method"] == "stock":
        model = cls.from_pretrained(spec["dir"], torch_dtype=dtype)
    else:
        raise ValueError(spec["method"])
    t1 = time.perf_counter()
    state = model.state_dict()
    _touch(state.values())
    t2 = time.perf_counter()
    peak = _status_kib("VmHWM")
    digest, crcs = _digest(state.items())
    return {"seconds": t2 - t0, "seconds_call": t1 - t0, "peak_rss": peak - baseline,
            "baseline_rss": baseline, "peak_reset": reset, "tensors": len(state),
            "bytes": _nbytes(state.values()), "digest": digest, "crcs": crcs,
            "files_read_by_loadstone": len(read_by_loadstone)}


def child_dispatch(spec):
    import zlib

    import accelerate
    import torch
    import transformers

    import loadstone.torch

    offload = spec["offload"]
    try:
        config = transformers.AutoConfig.from_pretrained(spec["dir"])
        with accelerate.init_empty_weights():
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.eval()
        fn = {"loadstone": loadstone.torch.load_checkpoint_and_dispatch,
              "loadstone_in_place": loadstone.torch.load_checkpoint_and_dispatch,
              "accelerate": accelerate.load_checkpoint_and_dispatch}[spec["method"]]
        kwargs = dict(device_map="auto", max_memory={"cpu": spec["cpu_bytes"]},
                      offload_folder=offload, no_split_module_classes=["LlamaDecoderLayer"])
        if spec["method"] == "loadstone_in_place":
            kwargs["offload_in_place"] = True
        baseline, reset = _reset_peak()
        t0 = time.perf_counter()
        model = fn(model, spec["dir"], **kwargs)
        t1 = time.perf_counter()
        state = model.state_dict()
        resident = [(k, v) for k, v in state.items() if v.device.type != "meta"]
        _touch(v for _, v in resident)
        t2 = time.perf_counter()
        peak = _status_kib("VmHWM")
        offload_bytes = sum(os.path.getsize(os.path.join(d, f))
                            for d, _, fs in os.walk(offload) for f in fs)
        digest, crcs = _digest(resident)
        ids = (torch.arange(1, 17, dtype=torch.long) * 7919 % config.vocab_size).unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        lb = logits.detach().float().contiguous().reshape(-1).view(torch.uint8).numpy()
        return {"seconds": t2 - t0, "seconds_call": t1 - t0, "peak_rss": peak - baseline,
                "baseline_rss": baseline, "peak_reset": reset,
                "tensors": len(resident), "tensors_meta": len(state) - len(resident),
                "bytes": _nbytes(v for _, v in resident), "offload_bytes": offload_bytes,
                "device_map": {k: str(v) for k, v in model.hf_device_map.items()},
                "digest": digest, "crcs": crcs,
                "logits_crc": f"{zlib.crc32(lb):08x}",
                "logits_head": [float(x) for x in logits.reshape(-1)[:4]]}
    finally:
        shutil.rmtree(offload, ignore_errors=True)


CHILDREN = {"load_file": child_load_file, "shards": child_load_file,
            "diffusers": child_diffusers, "dispatch": child_dispatch}


def child_main(spec_text):
    spec = json.loads(spec_text)
    try:
        result = CHILDREN[spec["case"]](spec)
    except Exception as e:  # a method that fails is reported, not skipped
        import traceback

        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


def versions_main():
    out = {"python": platform.python_version()}
    for mod in ("torch", "safetensors", "numpy", "accelerate", "diffusers", "transformers",
                "loadstone"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
            if mod == "loadstone":
                out["loadstone_path"] = os.path.dirname(m.__file__)
            if mod == "torch":
                out["torch_threads"] = m.get_num_threads()
        except Exception as e:
            out[mod] = f"unavailable: {type(e).__name__}: {e}"
    print(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# Making the models (once, in a child: needs torch)
# ---------------------------------------------------------------------------------------------

def _llama_tensors(shape, torch, gen):
    """A Llama-shaped state dict, bf16, N(0, 0.02)."""
    h, i, v = shape["hidden"], shape["intermediate"], shape["vocab"]

    def w(*dims):
        return (torch.randn(*dims, generator=gen, dtype=torch.float32) * 0.02).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": w(v, h)}
    for n in range(shape["layers"]):
        p = f"model.layers.{n}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[p + f"self_attn.{proj}.weight"] = w(h, h)
        out[p + "mlp.gate_proj.weight"] = w(i, h)
        out[p + "mlp.up_proj.weight"] = w(i, h)
        out[p + "mlp.down_proj.weight"] = w(h, i)
        out[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        out[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    out["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    out["lm_head.weight"] = w(v, h)
    return out


def make_main(kind, out, small):
    import torch

    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(1234)
    shape = TINY_LLAMA if small else LLAMA
    if kind == "file":
        from safetensors.torch import save_file

        save_file(_llama_tensors(shape, torch, gen), os.path.join(out, "model.safetensors"),
                  metadata={"format": "pt"})
        info = {"what": "one bf16 safetensors file, Llama-shaped", "shape": shape}
    elif kind == "shards":  # --small only: the full run uses the 3.6 GiB bench model
        from safetensors.torch import save_file

        tensors = _llama_tensors(shape, torch, gen)
        names = list(tensors)
        parts = [names[k::3] for k in range(3)]
        weight_map = {}
        for k, part in enumerate(parts):
            fname = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
            save_file({n: tensors[n] for n in part}, os.path.join(out, fname),
                      metadata={"format": "pt"})
            weight_map.update({n: fname for n in part})
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
        info = {"what": "three bf16 shards, Llama-shaped (--small)", "shape": shape}
    elif kind == "unet":
        from diffusers import UNet2DConditionModel

        config = TINY_UNET if small else SD15_UNET
        model = UNet2DConditionModel(**config).to(torch.float16)
        model.save_pretrained(out, safe_serialization=True)
        info = {"what": "UNet2DConditionModel, random init, saved by save_pretrained in float16",
                "config": "tiny (diffusers' tests)" if small else "Stable Diffusion 1.5 UNet",
                "parameters": sum(p.numel() for p in model.parameters())}
    elif kind == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                             num_attention_heads=shape["heads"],
                             num_key_value_heads=shape["heads"],
                             num_hidden_layers=shape["layers"], vocab_size=shape["vocab"],
                             max_position_embeddings=2048, tie_word_embeddings=False)
        model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
        # The weights: N(0, 0.02) from one generator (the model's own init is slower and not
        # seeded the same way across versions); strict: every parameter gets one.
        model.load_state_dict(_llama_tensors(shape, torch, gen), strict=True)
        model.save_pretrained(out, safe_serialization=True)
        info = {"what": "LlamaForCausalLM, saved by save_pretrained in bfloat16", "shape": shape,
                "parameters": sum(p.numel() for p in model.parameters())}
    else:
        raise ValueError(kind)
    print(json.dumps(info))


# ---------------------------------------------------------------------------------------------
# Parent side (standard library only)
# ---------------------------------------------------------------------------------------------

def fmt_bytes(n):
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def checkpoint_files(path):
    """Every file of a checkpoint: the file itself, or every file under its folder."""
    if os.path.isfile(path):
        return [path]
    out = []
    for d, _, fs in os.walk(path):
        out.extend(os.path.join(d, f) for f in fs if f != MARKER)
    return sorted(out)


def tree_bytes(path):
    return sum(os.path.getsize(f) for f in checkpoint_files(path))


def drop_cache(files):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_through(files):
    buf = bytearray(8 * MiB)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


_libc = None


def resident_fraction(files):
    """Fraction of the files' pages in the page cache (mincore over a shared read-only mapping),
    or None where that cannot be asked."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.mmap.restype = ctypes.c_void_p
            _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_long]
            _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
            _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        total = resident = 0
        for f in files:
            size = os.path.getsize(f)
            if size == 0:
                continue
            pages = (size + PAGE - 1) // PAGE
            fd = os.open(f, os.O_RDONLY)
            try:
                addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
                if addr in (None, ctypes.c_void_p(-1).value):
                    return None
                try:
                    vec = ctypes.create_string_buffer(pages)
                    if _libc.mincore(addr, size, vec) != 0:
                        return None
                    resident += sum(b & 1 for b in vec.raw[:pages])
                finally:
                    _libc.munmap(addr, size)
            finally:
                os.close(fd)
            total += pages
        return resident / total if total else None
    except (OSError, AttributeError):
        return None


def child_env():
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "LOADSTONE_NO_PROGRESS": "1", "TRANSFORMERS_VERBOSITY": "error",
                "DIFFUSERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
                "PYTHONUNBUFFERED": "1"})
    return env


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def run_child(python, args, timeout):
    try:
        p = subprocess.run([python, os.path.abspath(__file__), *args], capture_output=True,
                           text=True, env=child_env(), timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    doc = last_json(p.stdout)
    if doc is None or p.returncode != 0 and "error" not in doc:
        tail = (p.stderr or p.stdout).strip().splitlines()[-6:]
        return {"error": f"exit {p.returncode}: " + " | ".join(tail)}
    if "error" in doc:
        tail = p.stderr.strip().splitlines()[-3:]
        doc["error"] += (" | " + " | ".join(tail)) if tail else ""
    return doc


def ensure_made(python, workdir, name, kind, small, timeout):
    """workdir/name made once by a `--make kind` child; reused when its marker is there."""
    final = os.path.join(workdir, name)
    if os.path.exists(os.path.join(final, MARKER)):
        return final
    if os.path.exists(final):
        sys.exit(f"{final} exists but was not made by this script: move it away or pick another "
                 "--workdir")
    os.makedirs(workdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=name + ".partial-", dir=workdir)
    log(f"making {final} ({kind}{', small' if small else ''}) ...")
    t0 = time.time()
    try:
        p = subprocess.run([python, os.path.abspath(__file__), "--make", kind, "--out", tmp]
                           + (["--small"] if small else []), capture_output=True, text=True,
                           env=child_env(), timeout=timeout)
        info = last_json(p.stdout)
        if p.returncode != 0 or info is None:
            sys.exit(f"making {name} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
        for f in checkpoint_files(tmp):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        info["bytes"] = tree_bytes(tmp)
        info["made"] = datetime.datetime.now().isoformat(timespec="seconds")
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump(info, f, indent=1)
        os.chmod(tmp, 0o755)  # mkdtemp made it 0700
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"  made in {time.time() - t0:.0f} s: {fmt_bytes(info['bytes'])}")
    return final


def model_info(path):
    try:
        with open(os.path.join(path, MARKER)) as f:
            return json.load(f)
    except OSError:
        return {}


def machine():
    m = {"cpus": os.cpu_count(), "kernel": platform.release(), "arch": platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    m["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    m["memory_bytes"] = int(line.split()[1]) * 1024
        with open("/proc/loadavg") as f:
            m["loadavg_at_start"] = f.read().split()[:3]
    except OSError:
        pass
    return m


def filesystem_of(path):
    best, fs = "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, typ = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best):
                    best, fs = mnt, {"device": dev, "mount": mnt, "type": typ}
    except OSError:
        pass
    return fs


def git_commit():
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def summarize(samples, key):
    vals = [s[key] for s in samples if "error" not in s and key in s]
    if not vals:
        return None
    return {"n": len(vals), "median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="load_file,shards,diffusers,dispatch")
    ap.add_argument("--mode", default="cold,warm", help="cold, warm or cold,warm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds of quiet before each run")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the timed children")
    ap.add_argument("--workdir", default="/var/tmp/loadstone-pybench",
                    help="where the generated models (and each run's offload folder) go")
    ap.add_argument("--model", default="/var/tmp/loadstone-bench-llama40",
                    help="the bench model of the shards case (made with --loadstone-cli demo "
                         "--layers 40 if missing)")
    ap.add_argument("--loadstone-cli", default=os.path.join(REPO, "build", "loadstone"))
    ap.add_argument("--json", metavar="OUT", help="write the whole record here")
    ap.add_argument("--small", action="store_true",
                    help="shrink every generated model to a few MB (trying the script)")
    ap.add_argument("--remove-models", action="store_true",
                    help="delete the models this script generated in --workdir at the end")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds a child may take")
    # child and maker entry points
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--make", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--versions", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        return child_main(args.child)
    if args.make:
        return make_main(args.make, args.out, args.small)
    if args.versions:
        return versions_main()

    cases = [c for c in args.cases.split(",") if c]
    modes = [m for m in args.mode.split(",") if m]
    for c in cases:
        if c not in METHODS:
            sys.exit(f"unknown case {c!r}: pick from {','.join(METHODS)}")
    for m in modes:
        if m not in ("cold", "warm"):
            sys.exit(f"unknown mode {m!r}: cold or warm")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    workdir = os.path.abspath(args.workdir)
    made_workdir = not os.path.exists(workdir)
    os.makedirs(workdir, exist_ok=True)
    gen_root = os.path.join(workdir, "small") if args.small else workdir
    log(f"seed {seed}")

    versions = run_child(args.python, ["--versions"], 300)
    if "error" in versions or str(versions.get("loadstone", "")).startswith("unavailable"):
        sys.exit(f"{args.python} cannot import what the bench needs: {versions}")
    log("children: " + ", ".join(f"{k} {v}" for k, v in versions.items()))

    # What each case loads: (case, label, path, files, extra spec)
    targets_of = []
    made = []
    if "load_file" in cases:
        d = ensure_made(args.python, gen_root, "bf16-file", "file", args.small, args.timeout)
        made.append(d)
        f = os.path.join(d, "model.safetensors")
        targets_of.append(("load_file", os.path.basename(f), f, [f], {}))
    if "shards" in cases:
        if args.small:
            model = ensure_made(args.python, gen_root, "shards", "shards", True, args.timeout)
            made.append(model)
        else:
            model = args.model
            if not os.path.exists(model):
                log(f"making the bench model {model} ({args.loadstone_cli} demo --layers 40) ...")
                subprocess.run([args.loadstone_cli, "demo", "--layers", "40", "--dir", model],
                               check=True, stdout=subprocess.DEVNULL)
        shards = sorted(os.path.join(model, f) for f in os.listdir(model)
                        if f.endswith(".safetensors"))
        if not shards:
            sys.exit(f"no .safetensors shard in {model}")
        for f in shards:
            targets_of.append(("shards", os.path.basename(f), f, [f], {}))
    if "diffusers" in cases:
        d = ensure_made(args.python, gen_root, "unet-sd15-fp16" if not args.small
                        else "unet-tiny-fp16", "unet", args.small, args.timeout)
        made.append(d)
        targets_of.append(("diffusers", os.path.basename(d), d, checkpoint_files(d),
                           {"class": "UNet2DConditionModel", "dtype": "float16", "dir": d}))
    if "dispatch" in cases:
        d = ensure_made(args.python, gen_root, "llama-h2048-l10-bf16" if not args.small
                        else "llama-tiny-bf16", "llama", args.small, args.timeout)
        made.append(d)
        weights = sum(os.path.getsize(f) for f in checkpoint_files(d)
                      if f.endswith(".safetensors"))
        targets_of.append(("dispatch", os.path.basename(d), d, checkpoint_files(d),
                           {"dir": d, "cpu_bytes": weights // 2}))

    runs = []  # (case, label, path, files, extra, mode, method)
    for case, label, path, files, extra in targets_of:
        for mode in modes:
            for method, _ in METHODS[case]:
                runs.append((case, label, path, files, extra, mode, method))

    samples = {}  # (case, label, mode, method) -> [sample]
    run_tmp = tempfile.mkdtemp(prefix="runs-", dir=workdir)
    total = len(runs) * args.rounds
    k = 0
    started = time.time()
    try:
        for rnd in range(args.rounds):
            order = list(runs)
            rng.shuffle(order)
            for case, label, path, files, extra, mode, method in order:
                k += 1
                # Dirty pages of earlier runs (offload folders written) are written back first:
                # their writeback would otherwise throttle and slow whichever run came next.
                os.sync()
                if mode == "cold":
                    drop_cache(files)
                else:
                    read_through(files)
                resident = resident_fraction(files)
                time.sleep(args.settle)
                spec = {"case": case, "method": method, "files": files, **extra}
                if case == "dispatch":
                    spec["offload"] = tempfile.mkdtemp(prefix="offload-", dir=run_tmp)
                s = run_child(args.python, ["--child", json.dumps(spec)], args.timeout)
                if case == "dispatch":
                    shutil.rmtree(spec["offload"], ignore_errors=True)
                s["round"] = rnd
                s["resident_before"] = resident
                samples.setdefault((case, label, mode, method), []).append(s)
                what = (f"{s['seconds']:.3f} s (call {s['seconds_call']:.3f}), peak RSS "
                        f"{s['peak_rss'] / MiB:.0f} MiB" if "error" not in s else
                        f"ERROR {s['error'][:300]}")
                cached = "" if resident is None else f" [{resident:.0%} cached before]"
                log(f"[{k}/{total}] round {rnd + 1} {case} {label} {mode} {method}: {what}"
                    f"{cached}")
    finally:
        shutil.rmtree(run_tmp, ignore_errors=True)

    report = build_report(args, seed, versions, targets_of, modes, samples, started)
    print_report(report)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        log(f"wrote {args.json}")
    if args.remove_models:
        for d in made:
            if os.path.exists(os.path.join(d, MARKER)):
                shutil.rmtree(d)
                log(f"removed {d}")
        if args.small and os.path.isdir(gen_root) and not os.listdir(gen_root):
            os.rmdir(gen_root)
    if made_workdir and not os.listdir(workdir):
        os.rmdir(workdir)


def ratio(summ_base, summ_ls):
    if not summ_base or not summ_ls or summ_ls["median"] <= 0:
        return None
    return summ_base["median"] / summ_ls["median"]


def build_report(args, seed, versions, targets_of, modes, samples, started):
    m = machine()
    m["workdir_filesystem"] = filesystem_of(os.path.abspath(args.workdir))
    with open("/proc/loadavg") as f:
        m["loadavg_at_end"] = f.read().split()[:3]
    doc = {"bench": "bench/python_bench.py", "date": datetime.datetime.now().isoformat(
               timespec="seconds"), "commit": git_commit(), "machine": m,
           "versions": versions, "seed": seed, "rounds": args.rounds, "settle_s": args.settle,
           "small": args.small, "modes": modes, "wall_s": round(time.time() - started, 1),
           "notes": [
               "seconds: the timed work in a fresh process, imports before the clock; "
               "seconds_call: the call alone (differs where the result is lazy: mmap views "
               "then had one byte of every 4 KiB page touched, counted in seconds)",
               "peak_rss: VmHWM after the work minus VmRSS before it (peak reset with "
               "/proc/self/clear_refs 5 after the imports)",
               "ratios: median seconds of the baseline / median seconds of loadstone's method, "
               "same run; > 1 means loadstone is faster"],
           "cases": [], "ratios": [], "targets": []}
    for case, label, path, files, extra in targets_of:
        size = sum(os.path.getsize(f) for f in files)
        entry = {"case": case, "name": label, "path": path, "bytes": size,
                 "model": model_info(path if os.path.isdir(path) else os.path.dirname(path)),
                 "modes": {}}
        for mode in modes:
            per = {}
            for method, mlabel in METHODS[case]:
                ss = samples.get((case, label, mode, method), [])
                clean = [{k: v for k, v in s.items() if k != "crcs"} for s in ss]
                per[method] = {"label": mlabel, "samples": clean,
                               "seconds": summarize(ss, "seconds"),
                               "seconds_call": summarize(ss, "seconds_call"),
                               "peak_rss": summarize(ss, "peak_rss")}
            entry["modes"][mode] = per
            doc["ratios"].extend(case_ratios(case, label, mode, per))
            doc["targets"].extend(case_targets(case, label, path, mode, size, per, samples,
                                              args))
        doc["cases"].append(entry)
    return doc


def case_ratios(case, label, mode, per):
    out = []
    ls = LOADSTONE[case]
    for method, mlabel in METHODS[case]:
        if method == ls:
            continue
        for metric in ("seconds", "seconds_call"):
            r = ratio(per[method][metric], per[ls][metric])
            if metric == "seconds_call" and case in ("load_file", "shards") \
                    and method != "st_touch":
                continue  # the same number as "seconds" there
            out.append({"case": case, "name": label, "mode": mode, "metric": metric,
                        "numerator": per[method]["label"], "denominator": per[ls]["label"],
                        "baseline": method == BASELINE[case], "ratio": r})
    return out


def _digests_agree(case, label, mode, samples, key="digest"):
    """True when every sample of every method of (case, label, mode) has the same `key`; else the
    first disagreement as text."""
    seen = {}
    first_crcs = {}
    for method, _ in METHODS[case]:
        for s in samples.get((case, label, mode, method), []):
            if "error" in s or key not in s:
                continue
            seen.setdefault(s[key] if not isinstance(s[key], dict) else
                            json.dumps(s[key], sort_keys=True), []).append(method)
            first_crcs.setdefault(method, s.get("crcs"))
    if not seen:
        return None
    if len(seen) == 1:
        return True
    text = f"{key} differs: " + "; ".join(f"{sorted(set(v))}" for v in seen.values())
    crcs = [c for c in first_crcs.values() if c]
    if key == "digest" and len(crcs) >= 2:
        a, b = crcs[0], crcs[1]
        diff = [n for n in sorted(set(a) | set(b)) if a.get(n) != b.get(n)]
        text += f"; {len(diff)} tensors differ, first: {diff[:3]}"
    return text


def case_targets(case, label, path, mode, size, per, samples, args):
    out = []
    ls, base = LOADSTONE[case], BASELINE[case]
    r = ratio(per[base]["seconds"], per[ls]["seconds"])
    want = TARGETS[(case, mode)]
    what = {"load_file": "loadstone.torch.load_file vs safetensors load_file + clone",
            "shards": "loadstone.torch.load_file vs safetensors load_file + clone",
            "diffusers": "from_pretrained + every page touched: stock / patched",
            "dispatch": "load_checkpoint_and_dispatch + CPU pages touched: accelerate / loadstone"}
    out.append({"case": case, "name": label, "mode": mode, "target": f"ratio >= {want}",
                "what": what[case], "value": r,
                "pass": None if r is None else r >= want})
    if case in ("load_file", "shards"):
        limit = 1.1 * size + 64 * MiB
        ok = [s for s in samples.get((case, label, mode, ls), []) if "error" not in s]
        worst = max(s["peak_rss"] for s in ok) if ok else None
        unreset = sum(1 for s in ok if not s.get("peak_reset"))
        out.append({"case": case, "name": label, "mode": mode,
                    "target": f"peak RSS over baseline <= 1.1 x file + 64 MiB "
                              f"({limit / MiB:.0f} MiB), worst sample",
                    "what": "loadstone.torch.load_file", "value": worst,
                    "detail": f"{unreset} samples could not reset VmHWM (the imports count)"
                              if unreset else None,
                    "pass": None if worst is None or unreset else worst <= limit})
    if case == "diffusers":
        ok = [s for s in samples.get((case, label, mode, ls), []) if "error" not in s]
        n_files = sum(1 for f in checkpoint_files(path)
                      if f.endswith(".safetensors"))
        took = bool(ok) and all(s.get("files_read_by_loadstone", 0) >= n_files for s in ok)
        out.append({"case": case, "name": label, "mode": mode,
                    "target": "the patch took effect: loadstone read every weights file",
                    "what": f"{n_files} .safetensors files", "value": took,
                    "pass": took if ok else None})
    checks = [("digest", "every tensor bit for bit the same in every method and sample")]
    if case == "dispatch":
        checks += [("device_map", "hf_device_map the same"),
                   ("logits_crc", "logits of a forward pass bit for bit the same")]
    for key, text in checks:
        agree = _digests_agree(case, label, mode, samples, key)
        out.append({"case": case, "name": label, "mode": mode, "target": text,
                    "what": key, "value": agree if not isinstance(agree, str) else False,
                    "detail": agree if isinstance(agree, str) else None,
                    "pass": agree is True if agree is not None else None})
    if args.small:
        for t in out:
            t["note"] = "--small: the models are far below the issue's sizes; not a record"
    return out


def _fmt_s(summ):
    if not summ:
        return "—"
    return f"{summ['median']:.3f} ({summ['min']:.3f}–{summ['max']:.3f})"


def print_report(doc):
    m = doc["machine"]
    fs = m.get("workdir_filesystem") or {}
    print(f"python_bench {doc['date']}  commit {doc['commit']}  seed {doc['seed']}  "
          f"rounds {doc['rounds']}  settle {doc['settle_s']} s"
          + ("  --small" if doc["small"] else ""))
    print(f"machine: {m.get('cpus')} CPUs ({m.get('cpu', '?')}), "
          f"{m.get('memory_bytes', 0) / GiB:.1f} GiB, Linux {m['kernel']}, workdir on "
          f"{fs.get('type', '?')} {fs.get('device', '')}; load avg {m.get('loadavg_at_start')} → "
          f"{m.get('loadavg_at_end')}")
    v = doc["versions"]
    print("children: " + ", ".join(f"{k} {v[k]}" for k in
                                   ("python", "torch", "safetensors", "accelerate", "diffusers",
                                    "transformers", "loadstone", "torch_threads") if k in v)
          + (f" (from {v['loadstone_path']})" if "loadstone_path" in v else ""))
    print("seconds = median (min–max) of fresh processes, imports before the clock; "
          "GB/s = bytes on disk / median seconds")
    for entry in doc["cases"]:
        info = entry["model"]
        desc = info.get("what", "")
        for mode, per in entry["modes"].items():
            print()
            print(f"== {entry['case']}: {entry['name']} ({fmt_bytes(entry['bytes'])}"
                  f"{', ' + desc if desc else ''}), {mode} ==")
            print(f"  {'method':<70} {'n':>2}  {'seconds':<24} {'call alone':<24} "
                  f"{'GB/s':>6}  {'peak RSS MiB':>12}")
            for method, row in per.items():
                n = row["seconds"]["n"] if row["seconds"] else 0
                errs = sum(1 for s in row["samples"] if "error" in s)
                gbps = (entry["bytes"] / row["seconds"]["median"] / 1e9) if row["seconds"] else 0
                rss = row["peak_rss"]["median"] / MiB if row["peak_rss"] else 0
                star = "*" if method == BASELINE[entry["case"]] else " "
                print(f" {star}{row['label']:<70} {n:>2}  {_fmt_s(row['seconds']):<24} "
                      f"{_fmt_s(row['seconds_call']):<24} {gbps:>6.2f}  {rss:>12.0f}"
                      + (f"  ({errs} failed)" if errs else ""))
                for s in row["samples"]:
                    if "error" in s:
                        print(f"      error: {s['error'][:400]}")
            if mode == "cold":
                warmish = sum(1 for row in per.values() for s in row["samples"]
                              if (s.get("resident_before") or 0) > 0.01)
                if warmish:
                    print(f"   WARNING: {warmish} cold runs started with more than 1% of the "
                          "files still in the page cache (mincore)")
            if entry["case"] == "diffusers":
                ok = [s for s in per["patched"]["samples"] if "error" not in s]
                if ok:
                    print(f"   files read by loadstone in the patched runs: "
                          f"{sorted(set(s['files_read_by_loadstone'] for s in ok))}")
            if entry["case"] == "dispatch":
                for method, row in per.items():
                    ok = [s for s in row["samples"] if "error" not in s]
                    if ok:
                        print(f"   {row['label']}: {fmt_bytes(ok[0]['offload_bytes'])} written "
                              f"to the offload folder, {ok[0]['tensors_meta']} tensors left on "
                              f"meta (offloaded), {ok[0]['tensors']} in memory")
                print("   (loadstone and accelerate both write the disk part as NAME.dat "
                      "files; accelerate by default (offload_state_dict) also writes the CPU "
                      "part to a temporary folder and reads it back. With offload_in_place "
                      "loadstone's index points the disk part at the checkpoint's own "
                      "safetensors files and writes nothing: less work, listed apart)")
            for r in doc["ratios"]:
                if r["case"] == entry["case"] and r["name"] == entry["name"] and r["mode"] == mode:
                    val = "—" if r["ratio"] is None else f"{r['ratio']:.2f}×"
                    tag = "  (baseline*)" if r["baseline"] and r["metric"] == "seconds" else ""
                    metric = "" if r["metric"] == "seconds" else " [call alone]"
                    print(f"  ratio {val:>7}  {r['numerator']} / {r['denominator']}"
                          f"{metric}{tag}")
    print()
    print("targets (* = the baseline the ratio uses):")
    for t in doc["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "n/a "}[t["pass"]]
        val = t["value"]
        if isinstance(val, float):
            val = f"{val:.2f}×"
        elif isinstance(val, int) and not isinstance(val, bool):
            val = f"{val / MiB:.0f} MiB"
        print(f"  {verdict}  {t['case']} {t['name']} {t['mode']}: {t['target']} — {t['what']}: "
              f"{val}" + (f" ({t['detail']})" if t.get("detail") else ""))
    if doc["small"]:
        print("  (--small: the models are a few MB, far below the issue's sizes: not a record)")


if __name__ == "__main__":
    main()
