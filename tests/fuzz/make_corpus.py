#!/usr/bin/env python3
"""Writes tests/fuzz/corpus/<target>/: the fuzz targets' seed inputs, cut from the committed
fixtures (the producers' files), each in the form its target reads (the first byte, where a
target has one, picks what the rest is). Deterministic: rerun after the fixtures change.

    python3 tests/fuzz/make_corpus.py
"""
import glob
import hashlib
import io
import json
import os
import re
import shutil
import struct
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "fixtures")
MAX_SEED = 64 << 10  # a fuzzer mutates small inputs faster


def fixtures(pattern):
    return sorted(p for p in glob.glob(os.path.join(FIXTURES, pattern), recursive=True)
                  if os.path.isfile(p) and os.path.getsize(p) <= MAX_SEED)


def write(target, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


def folder_names():
    """fuzz_folder.cc's kNames, in order: a file's name is its index there."""
    source = open(os.path.join(HERE, "fuzz_folder.cc")).read()
    block = source[source.index("kNames[] = {"):source.index("};", source.index("kNames[] = {"))]
    return re.findall(r'"([^"]+)"', block)


def folder_input(root, flags, names):
    """The folder `root` as fuzz_folder reads it: its files whose names it knows, up to 64 KiB."""
    out = bytearray([flags])
    for i, name in enumerate(names):
        path = os.path.join(root, name)
        if os.path.isfile(path) and os.path.getsize(path) <= 0xFFFF:
            data = open(path, "rb").read()
            out += bytes([i]) + struct.pack("<H", len(data)) + data
    return bytes(out)


def bnb_states():
    """Each bitsandbytes fixture's quant-state JSON, with fuzz_quant_state's byte 0 for it."""
    for path in fixtures("bnb/**/*.safetensors"):
        data = open(path, "rb").read()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        for name, entry in header.items():
            if ".quant_state.bitsandbytes__" not in name:
                continue
            begin, end = entry["data_offsets"]
            text = data[8 + n + begin:8 + n + end]
            state = json.loads(text)
            yield (1 if state.get("quant_type") == "fp4" else 0) | (2 if "nested_blocksize" in state else 0), text


def main():
    shutil.rmtree(os.path.join(HERE, "corpus"), ignore_errors=True)
    for path in fixtures("**/*.safetensors"):
        data = open(path, "rb").read()
        write("checkpoint", b"\x00" + data)
        if len(data) >= 8:
            n = struct.unpack("<Q", data[:8])[0]
            if 0 < n <= len(data) - 8:
                write("safetensors_header", data[8:8 + n])
                write("json_scan", b"\x00" + data[8:8 + n])
                write("json_scan", b"\x05" + data[8:8 + n])
    for path in fixtures("**/*.bin"):
        data = open(path, "rb").read()
        write("checkpoint", b"\x01" + data)
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                for name in z.namelist():
                    if name.endswith("data.pkl"):
                        write("pickle", z.read(name))
        except zipfile.BadZipFile:
            pass
    for path in fixtures("**/*.gguf"):
        write("checkpoint", b"\x02" + open(path, "rb").read())
    for path in fixtures("**/config.json"):
        write("config", b"\x00" + open(path, "rb").read())
    for path in fixtures("**/quantize_config.json"):
        write("config", b"\x01" + open(path, "rb").read())
    for path in fixtures("**/*index*.json"):
        write("config", b"\x02" + open(path, "rb").read())
    for path in fixtures("**/*.json"):
        write("json_scan", b"\x00" + open(path, "rb").read())
    for text in ['"\\ud83d\\ude00"', "[1e500, -0, 18446744073709551616]", '{"a":1,"a":2}',
                 "[[[[[[[[]]]]]]]]", '"\xc3\xa9\\u00e9"', "{}\x00x"]:
        write("json_scan", b"\x00" + text.encode("latin-1"))
    for text in ["10GiB", "1.5GB", "0", "512MiB", "18446744073709551615"]:
        write("strings", b"\x00" + text.encode())
    for text in ["cpu", "cuda:1", "disk", "meta", "3"]:
        write("strings", b"\x01" + text.encode())
    for text in ["auto", "balanced_low_0", "sequential", '{"": "cpu"}', '{"a.b": 0, "c": "disk"}']:
        write("strings", b"\x02" + text.encode())
    for text in ["0", "cpu", "cuda:0", "disk"]:
        write("strings", b"\x03" + text.encode())
    for path in fixtures("devmap/**/*.json"):
        write("strings", b"\x04" + open(path, "rb").read())
    for path in fixtures("**/*.bin"):
        write("zip", open(path, "rb").read())
    for path in fixtures("**/*.gguf"):
        write("gguf", open(path, "rb").read())
    names = folder_names()
    for root in sorted({os.path.dirname(p) for p in glob.glob(os.path.join(FIXTURES, "**", "*"),
                                                              recursive=True)}):
        for flags in range(4):
            data = folder_input(root, flags, names)
            if len(data) > 1 and len(data) <= 4 * MAX_SEED:
                write("folder", data)
    for flags, text in bnb_states():
        write("quant_state", bytes([flags]) + text)
    # States of the harness's own weight (256 elements in 64-blocks), each kind once.
    for flags in range(4):
        state = {"quant_type": "fp4" if flags & 1 else "nf4", "blocksize": 64, "dtype": "bfloat16",
                 "shape": [16, 16]}
        if flags & 2:
            state.update({"nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.5})
        write("quant_state", bytes([flags]) + json.dumps(state).encode())
    for target in sorted(os.listdir(os.path.join(HERE, "corpus"))):
        files = os.listdir(os.path.join(HERE, "corpus", target))
        print(f"{target}: {len(files)} seeds")


if __name__ == "__main__":
    main()
