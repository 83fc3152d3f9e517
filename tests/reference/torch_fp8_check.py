"""Scaled float8 dequant against real PyTorch (manual: needs torch >= 2.1, not in CI's venv).

Writes compressed-tensors-style float8 weights (per channel with bf16 scales, per group of 64
with f16 scales, per tensor and per ragged 128 x 128 block with f32 scales) with
safetensors.torch, loads them with `loadstone load --dtype D --json`, and compares each
weight's CRC-32 with compressed-tensors' own formula run by PyTorch:
`x_q.to(scale.dtype) * scale`, then `.to(D)`.

    VENV/bin/python tests/reference/torch_fp8_check.py build/loadstone
"""
import json
import os
import subprocess
import sys
import tempfile
import zlib

import torch
from safetensors.torch import save_file

CASES = {  # name: weight shape, scale dtype, scale shape, how a scale repeats over the weight
    "channel": ((96, 256), torch.bfloat16, (96, 1), (1, 256)),
    "group": ((96, 256), torch.float16, (96, 4), (1, 64)),
    "tensor": ((96, 256), torch.float32, (), (96, 256)),
    "block": ((300, 200), torch.float32, (3, 2), (128, 128)),
}
TARGETS = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def main():
    cli = sys.argv[1]
    torch.manual_seed(0)
    tensors = {}
    for name, (shape, scale_dtype, scale_shape, _) in CASES.items():
        tensors[name + ".weight"] = (torch.randn(shape) * 64).to(torch.float8_e4m3fn)
        tensors[name + ".weight_scale"] = (torch.rand(scale_shape) * 0.01 + 0.001).to(scale_dtype)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.safetensors")
        save_file(tensors, path)
        for flag, target in TARGETS.items():
            out = subprocess.run([cli, "load", path, "--json", "--dtype", flag],
                                 capture_output=True, text=True, check=True).stdout
            got = {t["name"]: t["crc32"] for t in json.loads(out)["tensors"]}
            for name, (shape, _, _, block) in CASES.items():
                w, s = tensors[name + ".weight"], tensors[name + ".weight_scale"]
                s = s.reshape(1, 1) if s.dim() == 0 else s
                full = s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
                want = (w.to(s.dtype) * full[:shape[0], :shape[1]]).to(target).contiguous()
                crc = zlib.crc32(want.view(torch.uint8).numpy().tobytes())
                ok = got[name + ".weight"] == crc
                failures += not ok
                print(f"{flag} {name}: {'agrees' if ok else 'DIFFERS'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
