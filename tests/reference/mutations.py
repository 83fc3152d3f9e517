"""Mutations for crosscheck.py's corpus. A structured mutation changes a corpus.Header in place
and returns what it did; a byte mutation takes the file's bytes and returns (bytes, what)."""

import struct

from corpus import ALL_DTYPES, BAD_DTYPES, BITS, Pairs, Raw, dump, tensor

WEIRD_NUMBERS = ["-1", "1.0", "1e2", "-0", "\"1\"", "null", "true", "1E400", "1e-400",
                 "18446744073709551616", "18446744073709551615", "9223372036854775808", "01",
                 "0x10", "+1", "[]", "{}", "1.5e3", "-9223372036854775808"]


# ---- mutations of a Header: each changes it in place and returns what it did ----------------

def _pick_tensor(c, h):
    ts = h.tensors()
    return c.rng.choice(ts) if ts else None


def m_shift_offsets(c, h):
    t = _pick_tensor(c, h)
    if not t:
        return "shift: no tensor"
    which, delta = c.rng.choice([0, 1, None]), c.rng.choice([-9, -3, -1, 1, 2, 8])
    offsets = dict(t[2])["data_offsets"]
    for i in ([0, 1] if which is None else [which]):
        offsets[i] = max(0, offsets[i] + delta)
    return f"shift offsets of {t[1]!r} by {delta} ({'both' if which is None else which})"


def m_overlap(c, h):
    ts = h.tensors()
    if len(ts) < 2:
        return "overlap: fewer than 2 tensors"
    a, b = c.rng.sample(ts, 2)
    dict(b[2])["data_offsets"][:] = list(dict(a[2])["data_offsets"])
    return f"offsets of {b[1]!r} := those of {a[1]!r}"


def m_gap(c, h):
    ts = sorted(h.tensors(), key=lambda t: dict(t[2])["data_offsets"])
    if not ts:
        return "gap: no tensor"
    start, g = c.rng.choice(ts), c.rng.randint(1, 9)
    begin = dict(start[2])["data_offsets"][0]
    for _, _, v in ts:
        off = dict(v)["data_offsets"]
        if off[0] >= begin:
            off[0], off[1] = off[0] + g, off[1] + g
    h.data_len += g
    return f"gap of {g} bytes before offset {begin}"


def m_huge_shape(c, h):
    t = _pick_tensor(c, h)
    if not t:
        return "huge: no tensor"
    big = c.rng.choice([[2**32, 2**32], [2**63], [2**64 - 1], [2, 2**63], [2**62, 4], [3, 2**64 // 3],
                        [0, 2**64 - 1, 2**64 - 1], [2**64 - 1, 2**64 - 1, 0], [2**61], [2**60, 16]])
    dict(t[2])["shape"][:] = big
    return f"shape of {t[1]!r} := {big}"


def m_dtype(c, h):
    t = _pick_tensor(c, h)
    if not t:
        return "dtype: no tensor"
    dtype = c.rng.choice(BAD_DTYPES + ALL_DTYPES)
    for i, (k, _) in enumerate(t[2]):
        if k == "dtype":
            t[2][i] = ("dtype", dtype)
    return f"dtype of {t[1]!r} := {dtype!r}"


def m_weird_number(c, h):
    t = _pick_tensor(c, h)
    if not t:
        return "number: no tensor"
    field = c.rng.choice(["shape", "data_offsets"])
    values = dict(t[2])[field]
    if not values:
        values.append(1)
    i = c.rng.randrange(len(values))
    values[i] = Raw(c.rng.choice(WEIRD_NUMBERS))
    return f"{field}[{i}] of {t[1]!r} := {values[i]}"


def m_missing_field(c, h):
    t = _pick_tensor(c, h)
    if not t:
        return "missing: no tensor"
    field = c.rng.choice(["dtype", "shape", "data_offsets"])
    t[2][:] = [(k, v) for k, v in t[2] if k != field]
    return f"{t[1]!r} without {field}"


def random_json(rng, depth=0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 5:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == 6:
        return Pairs((f"k{i % 2}", random_json(rng, depth + 1)) for i in range(rng.randint(0, 3)))
    return [None, True, rng.randint(-5, 2**64 - 1), rng.random() * 1e6, "s\u00e9\n", None, None,
            {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}][kind]


def m_extra_field(c, h):
    t = _pick_tensor(c, h)
    if not t:
        return "extra: no tensor"
    key = c.rng.choice(["x", "extra", "Dtype", "offsets", "__metadata__", "dtype_"])
    t[2].insert(c.rng.randint(0, len(t[2])), (key, random_json(c.rng)))
    return f"unknown field {key!r} in {t[1]!r}"


def m_nesting(c, h):
    d = c.rng.randint(120, 130)
    nested = Raw("[" * d + "]" * d if c.rng.random() < 0.5 else '{"a":' * d + "0" + "}" * d)
    t = _pick_tensor(c, h)
    where = c.rng.choice(["field", "top", "metadata"]) if t else "top"
    if where == "field":
        t[2].append(("deep", nested))
    elif where == "top":
        h.pairs.append(("deep", nested))
    else:
        h.pairs.insert(0, ("__metadata__", Pairs([("deep", nested)])))
    return f"{d} levels of nesting in {where}"


BAD_UTF8 = [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80",
            b"\xf8\x88\x80\x80\x80", b"\xc3", b"\xe0\x80\xaf", b"\xfe\xfe"]
GOOD_UTF8 = [b"\xf0\x9f\x98\x80", b"\xef\xbf\xbf", b"\xf4\x8f\xbf\xbf", b"\xc2\x80", b"\x7f"]


def m_utf8(c, h):
    seq = c.rng.choice(BAD_UTF8 + GOOD_UTF8)
    h.raw_edits.append(lambda text: text.replace(b'"', b'"' + seq, 1))
    return f"bytes {seq.hex()} in the first key"


GOOD_WS, BAD_WS = [b" ", b"\t", b"\n", b"\r"], [b"\x0c", b"\x0b", b"\xc2\xa0", b"\xef\xbb\xbf", b"\0"]


def m_whitespace(c, h):
    pool = GOOD_WS if c.rng.random() < 0.6 else GOOD_WS + BAD_WS
    h.before = b"".join(c.rng.choice(pool) for _ in range(c.rng.randint(0, 3)))
    h.after = b"".join(c.rng.choice(pool) for _ in range(c.rng.randint(0, 3)))
    return f"around the JSON: {h.before!r} ... {h.after!r}"


def m_after_json(c, h):
    h.after = c.rng.choice([b"\0" * c.rng.randint(1, 8), b"\0garbage", b" \0", b"x", b"}", b"{}",
                            b"\0" + dump(h.pairs).encode()])
    return f"after the JSON: {h.after[:12]!r}"


def m_duplicate(c, h):
    rng = c.rng
    kind = rng.choice(["tensor", "tensor", "metadata_key", "metadata", "field"])
    t = _pick_tensor(c, h)
    if kind == "tensor" and t:
        value = t[2] if rng.random() < 0.5 else tensor("U8", [0], 0, 0)
        h.pairs.insert(rng.randint(0, len(h.pairs)), (t[1], value))
        return f"tensor {t[1]!r} twice"
    if kind == "field" and t:
        field = rng.choice(["dtype", "shape", "data_offsets"])
        value = dict(t[2]).get(field, "U8")
        t[2].append((field, value))
        return f"field {field} twice in {t[1]!r}"
    if kind == "metadata":
        h.pairs.insert(0, ("__metadata__", {"a": "1"}))
        h.pairs.append(("__metadata__", rng.choice([{"a": "2"}, None, {}])))
        return "__metadata__ twice"
    h.pairs.insert(0, ("__metadata__", Pairs([("k", "1"), ("j", "x"), ("k", "2")])))
    return "metadata key twice"


def m_metadata(c, h):
    h.pairs[:] = [(k, v) for k, v in h.pairs if k != "__metadata__"]
    value = c.rng.choice([None, {}, Raw("1"), Raw("[]"), Pairs([("a", 1)]), Raw('{"a":null}'),
                          Raw('{"a":{"b":"c"}}'), Raw('"x"'), {"a": "b", "é": "\u0000"},
                          Raw('{"a":["b"]}'), Raw('{"a":true}')])
    h.pairs.insert(c.rng.randint(0, len(h.pairs)), ("__metadata__", value))
    return f"__metadata__ := {dump(value)}"


def m_serde_forms(c, h):
    """Forms serde accepts for an enum ({"VARIANT": null}) and for a struct (its fields as an
    array), and near misses."""
    t = _pick_tensor(c, h)
    if not t:
        return "serde: no tensor"
    fields = dict(t[2])
    dtype, shape, offsets = fields.get("dtype"), fields.get("shape"), fields.get("data_offsets")
    if c.rng.random() < 0.5 and isinstance(dtype, str):
        form = c.rng.choice(['{"%s":null}', '{"%s":[]}', '{"%s":{}}', '{"%s":null,"F32":null}', "{}"])
        form = Raw(form % dtype if "%s" in form else form)
        t[2][:] = [(k, form if k == "dtype" else v) for k, v in t[2]]
        return f"dtype of {t[1]!r} := {form}"
    items = c.rng.choice([[dtype, shape, offsets], [dtype, shape], [dtype, shape, offsets, 1],
                          [shape, dtype, offsets]])
    h.pairs[t[0]] = (t[1], Raw(dump(items)))
    return f"{t[1]!r} as the array {dump(items)[:60]}"


def m_escapes(c, h):
    t = _pick_tensor(c, h)
    if not t:
        return "escape: no tensor"
    name = t[1]
    key = c.rng.choice([
        Raw('"' + "".join(f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else ch for ch in name) + '"'),
        Raw('"\\ud800"'), Raw('"\\udc00x"'), Raw('"\\ud83d\\ude00"'), Raw('"a\\x"'),
        Raw('"\\u005f_metadata__"'), Raw('"\\/"')])
    h.pairs[t[0]] = (key, t[2])
    return f"key {name!r} written {key}"


def m_zero_sized(c, h):
    ends = sorted({o for _, _, v in h.tensors() for o in dict(v).get("data_offsets", [])
                   if isinstance(o, int)} | {0})
    k = c.rng.choice(ends + [ends[-1] + 1])
    for i in range(c.rng.randint(1, 3)):
        h.pairs.append((f"zero{i}", tensor(c.rng.choice(ALL_DTYPES), [c.rng.randint(0, 2), 0], k, k)))
    return f"zero-sized tensors at [{k},{k}]"


def m_subbyte(c, h):
    ends = [o for _, _, v in h.tensors() for o in dict(v).get("data_offsets", [])[1:] if isinstance(o, int)]
    begin = max(ends, default=0)
    dtype, count = c.rng.choice(["F4", "F6_E2M3", "F6_E3M2"]), c.rng.randint(0, 9)
    size = (count * BITS[dtype] + 7) // 8 if c.rng.random() < 0.5 else count * BITS[dtype] // 8
    h.pairs.append(("subbyte", tensor(dtype, [count], begin, begin + size)))
    h.data_len = max(h.data_len, begin + size)
    return f"{dtype} x {count} in {size} bytes"


STRUCTURED = [m_shift_offsets, m_overlap, m_gap, m_huge_shape, m_dtype, m_weird_number,
              m_missing_field, m_extra_field, m_nesting, m_utf8, m_whitespace, m_after_json,
              m_duplicate, m_metadata, m_serde_forms, m_escapes, m_zero_sized, m_subbyte]


# ---- mutations of the final bytes -------------------------------------------------------------

def b_truncate(c, data):
    cut = c.rng.randint(0, max(0, len(data) - 1))
    return data[:cut], f"truncated to {cut} of {len(data)} bytes"


def b_append(c, data):
    extra = bytes(c.rng.getrandbits(8) for _ in range(c.rng.randint(1, 40)))
    return data + extra, f"{len(extra)} bytes appended"


def b_flip(c, data):
    n = struct.unpack("<Q", data[:8])[0] if len(data) >= 8 else 0
    end = min(len(data), 8 + n)
    if end <= 8:
        return data, "flip: no header"
    out, where = bytearray(data), []
    for _ in range(c.rng.randint(1, 3)):
        i = c.rng.randrange(8, end)
        out[i] = c.rng.getrandbits(8)
        where.append(f"{i}={out[i]:02x}")
    return bytes(out), "header bytes " + ",".join(where)


def b_prefix(c, data):
    n = struct.unpack("<Q", data[:8])[0]
    size = len(data)
    lie = c.rng.choice([n + 1, n - 1, n + 8, max(0, n - 8), 0, 1000, 100_000_000, 100_000_001,
                        2**63, 2**64 - 1, size - 8, size - 7, 2**64 - 8])
    return struct.pack("<Q", max(0, lie) % 2**64) + data[8:], f"length prefix {n} := {lie}"


BYTES = [b_truncate, b_append, b_flip, b_prefix]
