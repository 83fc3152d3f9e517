"""Hugging Face folder cases for crosscheck.py. The reference has no folder logic, so these
cases carry loadstone's expected verdict from specs/safetensors.md ("Sharded checkpoints"):
every file the index names exists and holds exactly the tensors mapped to it, no tensor is in
two shards, and an error names the tensor and the shard."""

import json
import os

from corpus import nbytes, write_reference
from mutations import b_truncate


class FolderCase:
    def __init__(self, root, open_path, options, how, expect):
        self.root = root            # what file paths are relative to
        self.open_path = open_path
        self.options = options      # extra CLI arguments (--variant, --subfolder)
        self.how = how
        # ("ok", [shard paths relative to root]) or ("error", code, [strings the message names])
        self.expect = expect


def _tensors(c, prefix):
    used = set()
    out = []
    for _ in range(c.rng.randint(2, 9)):
        name = f"{prefix}layers.{c.rng.randint(0, 99)}.{c.rng.choice(['w', 'b', 'norm', 'proj'])}"
        if name in used:
            continue
        used.add(name)
        dtype = c.rng.choice(["F32", "F16", "BF16", "I8", "U8"])
        shape = [c.rng.randint(1, 4) for _ in range(c.rng.randint(0, 2))]
        out.append((name, dtype, shape, bytes(nbytes(dtype, shape))))
    return out


def _write_index(path, weight_map, flat):
    index = weight_map if flat else {"metadata": {"total_size": 0}, "weight_map": weight_map}
    with open(path, "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


def make(c, root):
    """One random sharded folder under `root`, consistent or broken in one way."""
    rng = c.rng
    layout = rng.choice(["plain", "plain", "variant", "diffusers"])
    folder, options, prefix, index_name = root, [], "model", "model.safetensors.index.json"
    if layout == "variant":
        options, prefix, index_name = ["--variant", "fp16"], "model.fp16", "model.safetensors.index.fp16.json"
    elif layout == "diffusers":
        folder = os.path.join(root, "unet")
        options, prefix = ["--subfolder", "unet"], "diffusion_pytorch_model"
        index_name = "diffusion_pytorch_model.safetensors.index.json"
    os.makedirs(folder, exist_ok=True)
    tensors = _tensors(c, rng.choice(["", "model.", "text_model.encoder."]))
    shards = rng.randint(1, min(4, len(tensors)))
    names = [f"{prefix}-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    parts = [tensors[i::shards] for i in range(shards)]
    weight_map = {t[0]: names[i] for i in range(shards) for t in parts[i]}
    rel = os.path.relpath(folder, root)
    shard_paths = sorted(os.path.normpath(os.path.join(rel, n)) for n in names)
    fault = rng.choice(["none", "none", "none", "missing_shard", "unmapped", "ghost",
                        "two_shards", "wrong_shard", "corrupt_shard", "bad_index", "escape"])
    broken = None
    if fault == "missing_shard":
        broken = ("NotFound", [rng.choice(names)])
    elif fault == "unmapped" and any(len(p) > 1 for p in parts):
        i = rng.choice([i for i, p in enumerate(parts) if len(p) > 1])
        name = rng.choice(parts[i])[0]
        del weight_map[name]
        broken = ("Corruption", [name, names[i]])
    elif fault == "ghost":
        i = rng.randrange(shards)
        weight_map["ghost.weight"] = names[i]
        broken = ("Corruption", ["ghost.weight", names[i]])
    elif fault == "two_shards" and shards > 1:
        i, j = rng.sample(range(shards), 2)
        twin = parts[i][0]
        parts[j] = parts[j] + [twin]
        broken = ("Corruption", [twin[0]])
    elif fault == "wrong_shard" and shards > 1:
        i, j = rng.sample(range(shards), 2)
        name = parts[i][0][0]
        weight_map[name] = names[j]
        broken = ("Corruption", [name])
    elif fault == "escape":
        weight_map[tensors[0][0]] = "../" + names[0]
        broken = ("Corruption", [tensors[0][0]])
    if broken is None and fault not in ("none", "corrupt_shard", "bad_index"):
        fault = f"none ({fault} does not apply)"
    for name, part in zip(names, parts):
        write_reference(os.path.join(folder, name), part, rng.choice([None, {"format": "pt"}]))
    _write_index(os.path.join(folder, index_name), weight_map, flat=rng.random() < 0.2)
    if fault == "missing_shard":
        os.remove(os.path.join(folder, broken[1][0]))
    elif fault == "corrupt_shard":
        victim = os.path.join(folder, rng.choice(names))
        with open(victim, "rb") as f:
            data, how = b_truncate(c, f.read())
        with open(victim, "wb") as f:
            f.write(data)
        broken = ("Corruption", [os.path.basename(victim)])
        fault += f" ({how})"
    elif fault == "bad_index":
        with open(os.path.join(folder, index_name), "r+") as f:
            f.truncate(rng.randint(0, 20))
        broken = (None, [])
    open_path = root
    if rng.random() < 0.25:
        open_path, options = os.path.join(folder, index_name), []
    how = f"{layout} folder, {shards} shard(s), {len(tensors)} tensors, fault {fault}"
    if broken is None:
        return FolderCase(root, open_path, options, how, ("ok", shard_paths))
    return FolderCase(root, open_path, options, how, ("error", *broken))
