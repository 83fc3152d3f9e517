#!/usr/bin/env python3
"""Writes tests/fuzz/corpus/<target>/: the fuzz targets' seed inputs, cut from the committed
fixtures (the producers' files), each in the form its target reads (the first byte, where a
target has one, picks what the rest is). Deterministic: rerun after the fixtures change.

    python3 tests/fuzz/make_corpus.py
"""
import glob
import hashlib
import io
import os
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


def main():
    shutil.rmtree(os.path.join(HERE, "corpus"), ignore_errors=True)
    for path in fixtures("**/*.safetensors"):
        data = open(path, "rb").read()
        write("checkpoint", b"\x00" + data)
        if len(data) >= 8:
            n = struct.unpack("<Q", data[:8])[0]
            if 0 < n <= len(data) - 8:
                write("safetensors_header", data[8:8 + n])
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
    for target in sorted(os.listdir(os.path.join(HERE, "corpus"))):
        files = os.listdir(os.path.join(HERE, "corpus", target))
        print(f"{target}: {len(files)} seeds")


if __name__ == "__main__":
    main()
