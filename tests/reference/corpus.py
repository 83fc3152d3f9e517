"""The seeded corpus of crosscheck.py: valid files from the reference writer, and files made
from them (or from scratch) by mutations that break one rule or stress one corner.

A header is kept as a list of (key, value) pairs so that keys can repeat; a value is a Python
JSON value, a Pairs (an object that may repeat keys) or Raw (JSON text written as is).
"""

import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from make_safetensors_fixtures import WRITER_DTYPES, nbytes, write_reference  # noqa: E402

ALL_DTYPES = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
              "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
              "C64", "F64", "I64", "U64"]
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16,
        "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
BAD_DTYPES = ["F128", "f32", "", "BF16 ", "float32", "Q4_0", "F8_E4M3FN", "bool", "I4", "F6"]
NAME_CHARS = "abcxyzABZ0189._-/:" + "é名😀" + "\"\\\t\n\u0000\u001f\u007f\u2028 "


class Pairs(list):
    """A JSON object as a list of (key, value); keys may repeat."""


class Raw(str):
    """JSON text, written as is."""


def dump(value):
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ",".join(dump(k) + ":" + dump(v) for k, v in value) + "}"
    if isinstance(value, dict):
        return dump(Pairs(value.items()))
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class Header:
    """A header being built: pairs, the data section's length, and the bytes around the JSON."""

    def __init__(self, pairs, data_len):
        self.pairs = Pairs(pairs)
        self.data_len = data_len
        self.before, self.after = b"", b""
        self.raw_edits = []  # functions bytes → bytes applied to the header text

    def tensors(self):
        return [(i, k, v) for i, (k, v) in enumerate(self.pairs)
                if k != "__metadata__" and isinstance(v, Pairs)]

    def encode(self):
        text = self.before + dump(self.pairs).encode("utf-8", "surrogatepass") + self.after
        for edit in self.raw_edits:
            text = edit(text)
        text += b" " * (-(8 + len(text)) % 8)
        return text


def tensor(dtype, shape, begin, end):
    return Pairs([("dtype", dtype), ("shape", list(shape)), ("data_offsets", [begin, end])])


def parse_file(data):
    """A reference-written file back into a Header (whose encode() gives the same JSON)."""
    n = struct.unpack("<Q", data[:8])[0]
    doc = json.loads(data[8:8 + n].decode("utf-8"), object_pairs_hook=Pairs)
    return Header(doc, len(data) - 8 - n), data[8 + n:]


class Corpus:
    def __init__(self, rng, folder):
        self.rng, self.folder = rng, folder

    def name(self, used):
        rng = self.rng
        while True:
            length = rng.randint(1, 12)
            if rng.random() < 0.7:
                s = "".join(rng.choice("abcdefghijklmnop._0123456789") for _ in range(length))
            else:
                s = "".join(rng.choice(NAME_CHARS) for _ in range(length))
            if s not in used and s != "__metadata__":
                used.add(s)
                return s

    def shape(self, dtype):
        rng = self.rng
        shape = [rng.choice([0, 1, 1, 2, 2, 3, 4, 5]) for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4]))]
        if dtype == "F4":
            shape = (shape or [1])[:-1] + [2 * rng.randint(0, 3)]
        return shape

    def metadata(self):
        rng = self.rng
        if rng.random() < 0.4:
            return None
        used = set()
        return {self.name(used): self.name(set()) for _ in range(rng.choice([0, 1, 1, 2, 3]))}

    def valid(self, path):
        """A random file from the reference writer; returns its spec for the writer check."""
        rng = self.rng
        used = set()
        specs = []
        for _ in range(rng.choice([0, 1, 2, 3, 4, 5, 8])):
            dtype = rng.choice(list(WRITER_DTYPES))
            shape = self.shape(dtype)
            data = bytes(rng.getrandbits(8) for _ in range(nbytes(dtype, shape)))
            if dtype == "BOOL":
                data = bytes(b & 1 for b in data)
            specs.append((self.name(used), dtype, shape, data))
        metadata = self.metadata()
        if not specs and metadata == {}:
            metadata = None  # safetensors 0.8.0 writes `{},"__metadata__":{}}` for this
        write_reference(path, specs, metadata)
        return specs, metadata

    def synthetic(self):
        """A header built by hand: every dtype (F6 too, which the writer cannot write),
        zero-sized tensors sharing offsets, sub-byte counts that may not end on a byte."""
        rng = self.rng
        used, pairs, offset = set(), [], 0
        for _ in range(rng.randint(1, 6)):
            dtype = rng.choice(ALL_DTYPES)
            shape = [rng.choice([0, 1, 2, 3, 5, 8]) for _ in range(rng.randint(0, 3))]
            size = numel(shape) * BITS.get(dtype, 8)
            size = size // 8 if size % 8 == 0 or rng.random() < 0.5 else size // 8 + 1
            pairs.append((self.name(used), tensor(dtype, shape, offset, offset + size)))
            offset += size
        if rng.random() < 0.5:
            pairs.insert(rng.randint(0, len(pairs)), ("__metadata__", self.metadata()))
        return Header(pairs, offset)
