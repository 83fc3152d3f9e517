#!/usr/bin/env python3
"""Differential test: `loadstone inspect --json` against the reference implementation.

    crosscheck.py --loadstone CLI --write-tool TOOL [--seed S] [--count N] [--folders N]
                  [--only ID] [--keep DIR]

A seeded corpus (corpus.py): files from the reference writer, the same files mutated (or
headers built by hand) to break one rule or stress one corner, three 100,000-tensor headers,
the edge cases of tests/fixtures, and Hugging Face folders (folders.py). For every file both
readers give a verdict, and they must agree:
  - the reference accepts: loadstone prints the same tensors (name, dtype, shape, offset from the
    header, nbytes) and metadata;
  - the reference rejects: loadstone exits 1 with one line `error: Corruption: <Name>: ...`,
    <Name> the reference's error (any per-tensor error when tensors share data_offsets, as the
    reference then checks them in hash order);
  - repeated keys: the reference keeps the last one; loadstone refuses with DuplicateKey on
    purpose (or InvalidHeaderDeserialization when the reference also finds the JSON invalid).
A hang (--timeout) or a signal is a failure. Files from the reference writer whose metadata has
at most one key (the reference writes metadata in hash order) must also come out of
loadstone::WriteSafetensors (via --write-tool) byte for byte. Exit 0 when all agree, else 1.
"""

import argparse
import concurrent.futures
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "fixtures")]
import corpus  # noqa: E402
import mutations  # noqa: E402
import folders  # noqa: E402
import st_reference as ref  # noqa: E402
from make_safetensors_fixtures import EDGE  # noqa: E402

EARLY_ERRORS = {"HeaderTooSmall", "HeaderTooLarge", "InvalidHeaderLength", "InvalidHeader"}


class FileCase:
    def __init__(self, ident, path, how, spec=None):
        self.ident, self.path, self.how, self.spec = ident, path, how, spec


def build_corpus(rng, work, count):
    c = corpus.Corpus(rng, work)
    cases = []
    for name, (data, note) in EDGE.items():
        path = os.path.join(work, f"edge_{name}.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        cases.append(FileCase(f"edge_{name}", path, note))
    for i in range(count):
        path = os.path.join(work, f"case{i:04d}.safetensors")
        if rng.random() < 0.3:
            spec = c.valid(path)
            cases.append(FileCase(f"case{i:04d}", path, "reference writer", spec))
            continue
        if rng.random() < 0.6:
            c.valid(path)
            with open(path, "rb") as f:
                header, data = corpus.parse_file(f.read())
            how = ["reference writer"]
        else:
            header, data, how = c.synthetic(), b"", ["built by hand"]
        structured = rng.random() < 0.8
        for _ in range(rng.choice([1, 1, 2]) if structured else 0):
            mutation = rng.choice(mutations.STRUCTURED)
            try:
                how.append(mutation(c, header))
            except (KeyError, TypeError, AttributeError, IndexError, ValueError):
                how.append(f"{mutation.__name__}: not applicable")
        text = header.encode()
        data = (data + bytes(max(0, header.data_len - len(data))))[:header.data_len]
        raw = struct.pack("<Q", len(text)) + text + data
        if not structured or rng.random() < 0.25:
            raw, what = rng.choice(mutations.BYTES)(c, raw)
            how.append(what)
        with open(path, "wb") as f:
            f.write(raw)
        cases.append(FileCase(f"case{i:04d}", path, "; ".join(how)))
    cases += big_cases(work)
    return cases


def big_cases(work):
    """100,000-tensor headers: valid, all at the same offsets (the JSON DoS), one bad at the end."""
    n = 100_000
    out = []
    for kind in ["valid", "same_offsets", "last_bad"]:
        entries = []
        for i in range(n):
            dtype, shape, begin, end = "U8", 1, i, i + 1
            if kind == "same_offsets":
                dtype, begin, end = "F32", 0, 4
            if kind == "last_bad" and i == n - 1:
                shape = 2
            entries.append(f'"t{i}":{{"dtype":"{dtype}","shape":[{shape}],"data_offsets":[{begin},{end}]}}')
        text = ("{" + ",".join(entries) + "}").encode()
        text += b" " * (-(8 + len(text)) % 8)
        path = os.path.join(work, f"big_{kind}.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + bytes(4 if kind == "same_offsets" else n))
        out.append(FileCase(f"big_{kind}", path, f"{n} tensors, {kind}"))
    return out


def run_ours(cli, path, options, timeout):
    start = time.monotonic()
    try:
        p = subprocess.run([cli, "inspect", "--json", path, *options], capture_output=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"problem": f"no answer within {timeout} s (hang)", "seconds": timeout}
    ours = {"rc": p.returncode, "seconds": time.monotonic() - start, "problem": None}
    err = p.stderr.decode("utf-8", "replace")
    if p.returncode < 0:
        ours["problem"] = f"killed by signal {-p.returncode}; stderr {err[-300:]!r}"
    elif p.returncode == 0:
        try:
            ours["catalog"] = json.loads(p.stdout)
        except ValueError as e:
            ours["problem"] = f"exit 0 but stdout is not JSON ({e}): {p.stdout[:200]!r}"
    elif p.returncode == 1:
        if not (err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1):
            ours["problem"] = f"exit 1 but stderr is not one line `error: ...`: {err[:300]!r}"
        fields = err[len("error: "):].split(": ", 2)
        ours["code"] = fields[0]
        ours["name"] = fields[1] if fields[0] == "Corruption" and len(fields) > 2 else None
        ours["message"] = err.strip()
    else:
        ours["problem"] = f"exit code {p.returncode}; stderr {err[-300:]!r}"
    return ours


def describe(ours):
    if ours.get("problem"):
        return ours["problem"]
    if ours["rc"] == 0:
        return f"accepts: {json.dumps(ours['catalog'], ensure_ascii=False)[:400]}"
    return ours["message"][:400]


def compare_catalog(got, want):
    # inspect --json leaves "metadata" out when the files have none (docs/cli.md).
    got = {**got, "metadata": got.get("metadata", {})}
    for key in ["format", "files", "metadata", "total_bytes"]:
        if got.get(key) != want[key]:
            return f"{key}: loadstone {got.get(key)!r}, reference {want[key]!r}"
    if len(got["tensors"]) != len(want["tensors"]):
        return f"{len(got['tensors'])} tensors, reference {len(want['tensors'])}"
    for g, w in zip(got["tensors"], want["tensors"]):
        if g != w:
            return f"tensor: loadstone {g}, reference {w}"
    return None


def shared_offsets(header):
    try:
        doc = json.loads(header.decode("utf-8"))
        offsets = [tuple(v["data_offsets"]) for k, v in doc.items()
                   if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v]
    except (ValueError, TypeError, AttributeError, RecursionError):
        return False
    return len(offsets) != len(set(offsets))


REPEATED = {"files": 0, "accepted by the reference": 0}


def check_file(case, ours):
    """None when loadstone agrees with the reference on `case`, else what differs."""
    if ours.get("problem"):
        return ours["problem"]
    verdict, view = ref.reference_view(case.path)
    size = os.path.getsize(case.path)
    header = ref.read_header(case.path)[1] if size >= 8 else b""
    duplicate = ref.has_duplicate_keys(header) if header else False
    if duplicate:
        REPEATED["files"] += 1
        REPEATED["accepted by the reference"] += verdict == "ok"
    want_names = None
    if verdict == "ok" and not duplicate:
        if ours["rc"] != 0:
            return "the reference accepts it"
        want = ref.expected_catalog(os.path.dirname(case.path), [os.path.basename(case.path)])
        got = dict(ours["catalog"])
        got["files"] = [{**f, "path": os.path.relpath(f["path"], os.path.dirname(case.path))}
                        for f in got["files"]]
        return compare_catalog(got, want)
    name = None if verdict == "ok" else ref.reference_error_name(view)
    if duplicate and name not in EARLY_ERRORS:
        want_names = {"DuplicateKey"} | ({name} if name == "InvalidHeaderDeserialization" else set())
    elif duplicate is None and name == "InvalidHeaderDeserialization":
        want_names = {name, "DuplicateKey"}
    elif name in ref.PER_TENSOR_ERRORS and shared_offsets(header):
        want_names = ref.PER_TENSOR_ERRORS
    elif name is not None:
        want_names = {name}
    if ours["rc"] == 0:
        return "loadstone accepts it"
    if ours["code"] != "Corruption":
        return f"want a Corruption error, got {ours['code']}"
    if want_names and ours["name"] not in want_names:
        return f"want error {' or '.join(sorted(want_names))}, got {ours['name']}"
    return None


def check_folder(case, ours):
    if ours.get("problem"):
        return ours["problem"]
    if case.expect[0] == "ok":
        if ours["rc"] != 0:
            return "a consistent folder is rejected"
        got = dict(ours["catalog"])
        got["files"] = [{**f, "path": os.path.relpath(f["path"], case.root)} for f in got["files"]]
        return compare_catalog(got, ref.expected_catalog(case.root, case.expect[1]))
    _, code, names = case.expect
    if ours["rc"] == 0:
        return "loadstone accepts it"
    if code and ours["code"] != code:
        return f"want a {code} error, got {ours['code']}"
    missing = [n for n in names if n not in ours["message"]]
    return f"the message does not name {missing}" if missing else None


def check_writer(cases, tool, work):
    """Reference-written files rewritten by loadstone. Skipped: metadata with several keys (the
    reference writes them in hash order) and empty metadata (the reference writes
    `"__metadata__":{}`, WriteSafetensors cannot tell {} from none)."""
    manifest, pairs = [], []
    for case in cases:
        if case.spec is None or case.spec[1] == {} or len(case.spec[1] or {}) > 1:
            continue
        out = case.path + ".loadstone"
        specs, metadata = case.spec
        manifest.append({"out": out, "metadata": metadata, "tensors": [
            {"name": n, "dtype": d, "shape": s, "hex": b.hex()} for n, d, s, b in specs]})
        pairs.append((case, out))
    path = os.path.join(work, "writer_manifest.json")
    with open(path, "w") as f:
        json.dump(manifest, f)
    p = subprocess.run([tool, path], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return len(pairs), [("writer", f"reference_write_tool failed: {p.stderr[-500:]}")]
    failures = []
    for case, out in pairs:
        with open(case.path, "rb") as a, open(out, "rb") as b:
            want, got = a.read(), b.read()
        if want != got:
            at = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), min(len(want), len(got)))
            failures.append((case.ident, f"writer output differs at byte {at}: loadstone "
                                         f"{got[max(0, at - 40):at + 40]!r}, reference {want[max(0, at - 40):at + 40]!r}"))
    return len(pairs), failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loadstone", required=True, help="the loadstone CLI")
    parser.add_argument("--write-tool", required=True, help="reference_write_tool")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--count", type=int, default=300, help="random files")
    parser.add_argument("--folders", type=int, default=40, help="random Hugging Face folders")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per loadstone run")
    parser.add_argument("--only", help="run only the case with this id")
    parser.add_argument("--keep", help="keep the corpus in this folder")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"crosscheck: seed {seed} (rerun: crosscheck.py --seed {seed}, or "
          f"LOADSTONE_CROSSCHECK_SEED={seed} ctest -R reference_crosscheck)", flush=True)
    start = time.monotonic()
    rng = random.Random(seed)
    work = args.keep or tempfile.mkdtemp(prefix="loadstone-crosscheck-")
    os.makedirs(work, exist_ok=True)
    files = build_corpus(rng, work, args.count)
    folder_cases = []
    for i in range(args.folders):
        fc = folders.make(corpus.Corpus(rng, work), os.path.join(work, f"folder{i:03d}"))
        fc.ident = f"folder{i:03d}"
        folder_cases.append(fc)
    if args.only:
        files = [c for c in files if c.ident == args.only]
        folder_cases = [c for c in folder_cases if c.ident == args.only]
    print(f"crosscheck: {len(files)} files and {len(folder_cases)} folders in {work} "
          f"({time.monotonic() - start:.1f} s to make)", flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs = {c.ident: pool.submit(run_ours, args.loadstone, c.path, [], args.timeout) for c in files}
        runs.update({c.ident: pool.submit(run_ours, args.loadstone, c.open_path, c.options, args.timeout)
                     for c in folder_cases})
        failures = []
        for c in files:
            problem = check_file(c, runs[c.ident].result())
            if problem:
                failures.append((c, problem))
        for c in folder_cases:
            problem = check_folder(c, runs[c.ident].result())
            if problem:
                failures.append((c, problem))
    written, writer_failures = check_writer(files, args.write_tool, work)
    accepted = sum(1 for c in files if runs[c.ident].result().get("rc") == 0)
    for c in files:
        if c.ident.startswith("big_"):
            print(f"crosscheck: {c.ident}: loadstone took {runs[c.ident].result()['seconds']:.2f} s")

    for case, problem in failures:
        ours = runs[case.ident].result()
        print(f"\nFAIL {case.ident}: {problem}\n  made by: {case.how}")
        if isinstance(case, FileCase):
            with open(case.path, "rb") as f:
                head = f.read(240)
            verdict, view = ref.reference_view(case.path)
            print(f"  file: {case.path} ({os.path.getsize(case.path)} bytes), starts {head!r}")
            print(f"  reference: {'accepts' if verdict == 'ok' else view}")
        else:
            print(f"  folder: {case.open_path} {' '.join(case.options)}; want {case.expect}")
        print(f"  loadstone: {describe(ours)}")
    for ident, problem in writer_failures:
        print(f"\nFAIL writer {ident}: {problem}")
    print(f"crosscheck: {REPEATED['files']} files repeat a key; the reference accepted "
          f"{REPEATED['accepted by the reference']} of them keeping the last, loadstone must "
          "refuse them all with DuplicateKey (a deliberate difference)")
    total = len(files) + len(folder_cases) + written
    failed = len(failures) + len(writer_failures)
    print(f"\ncrosscheck: seed {seed}: {len(files)} files ({accepted} accepted by loadstone), "
          f"{len(folder_cases)} folders, {written} writer comparisons in "
          f"{time.monotonic() - start:.1f} s")
    print(f"crosscheck: {total - failed} passed, {failed} failed")
    if not args.keep:
        keep = {os.path.basename(c.path if isinstance(c, FileCase) else c.root) for c, _ in failures}
        keep |= {ident + ".safetensors" for ident, _ in writer_failures}
        for entry in os.listdir(work):
            if entry not in keep:
                path = os.path.join(work, entry)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        if not keep:
            os.rmdir(work)
    if failed:
        print(f"crosscheck: the failing cases are kept in {work}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
