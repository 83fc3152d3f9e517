"""What a process sees over a load's life: memory returned once every tensor is dropped (RSS
measured), Ctrl-C in a real terminal cancelling a load and freeing it, and corrupt or hostile
files raising — never ending the interpreter, never running a pickle's code. Each case runs in a
child interpreter, so that a crash is a failed test, not a dead test run."""
import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time

import safetensors.torch
import torch

from conftest import FIXTURES


def run_child(code, *args, timeout=120):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"child exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def sparse_safetensors(path, nbytes, name="w"):
    """A safetensors file of one uint8 tensor whose data is a hole: no disk written."""
    header = json.dumps({name: {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}})
    header += " " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + nbytes)


def test_dropping_every_tensor_returns_the_memory(tmp_path):
    path = tmp_path / "m.safetensors"
    tensors = {f"big.{i}": torch.randn(1024, 1024) for i in range(48)}  # 192 MiB
    tensors.update({f"small.{i}": torch.randn(100) for i in range(500)})
    safetensors.torch.save_file(tensors, path)
    got = run_child("""
        import gc, json, sys
        import loadstone, loadstone.torch as lt
        def rss():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))
        warm = lt.load_file(sys.argv[1]); del warm; gc.collect()   # imports, pools, arenas
        base = rss()
        loaded = lt.load_file(sys.argv[1])
        full = rss()
        handle = loadstone.Loader().load(sys.argv[1])
        kept = handle.result(); del handle
        both = rss()
        del loaded, kept; gc.collect()
        print(json.dumps({"base": base, "full": full, "both": both, "after": rss()}))
    """, path)
    mib = 1 << 20
    assert got["full"] - got["base"] > 180 * mib  # the tensors are resident
    assert got["both"] - got["full"] > 180 * mib  # a second load is memory of its own
    assert got["after"] - got["base"] < 24 * mib, got  # and all of it comes back


def test_ctrl_c_in_a_terminal_cancels_the_load_and_frees_it(tmp_path):
    big = tmp_path / "big.safetensors"
    sparse_safetensors(big, 6 << 30)
    small = tmp_path / "small.safetensors"
    safetensors.torch.save_file({"w": torch.ones(4)}, small)
    script = textwrap.dedent("""
        import gc, sys, loadstone
        def rss():
            with open("/proc/self/status") as f:
                return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))
        loader = loadstone.Loader(backend="pread", queue_depth=1, worker_threads=1)
        base = rss()
        print("loading", flush=True)
        try:
            loader.load(sys.argv[1], progress=True).result()
            print("finished before Ctrl-C", flush=True)
        except KeyboardInterrupt:
            gc.collect()
            print(f"interrupted rss+{(rss() - base) >> 20}MiB", flush=True)
            assert rss() - base < 64 << 20
            assert list(loader.load(sys.argv[2]).result()) == ["w"]
            print("ok", flush=True)
    """)
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own on the pty, Python at 80 columns
        os.execvpe(sys.executable, [sys.executable, "-c", script, str(big), str(small)],
                   {**os.environ, "LOADSTONE_NO_PROGRESS": ""})
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    out = b""
    deadline = time.monotonic() + 60
    sent = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if not sent and b"loading" in out:
            time.sleep(0.3)
            os.write(fd, b"\x03")  # Ctrl-C, as the terminal sends it
            sent = True
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert "finished before Ctrl-C" not in text, "the load ended before Ctrl-C: make it longer"
    assert "interrupted" in text and "ok" in text, text
    assert os.waitstatus_to_exitcode(status) == 0, text


HOSTILE = sorted((FIXTURES / "torch" / "hostile").iterdir()) + sorted(
    (FIXTURES / "gguf" / "malformed").glob("*.gguf"))


def test_hostile_and_corrupt_files_raise(tmp_path):
    marker = json.loads((FIXTURES / "torch" / "manifest.json").read_text())["marker"]
    if os.path.exists(marker):
        os.unlink(marker)
    got = run_child("""
        import json, sys
        import loadstone, loadstone.torch as lt
        outcome = {}
        for path in sys.argv[1:]:
            for name, call in (("load_state_dict", lt.load_state_dict), ("load_file", lt.load_file)):
                try:
                    call(path)
                    outcome[f"{path} {name}"] = "loaded"
                except loadstone.Error as e:
                    outcome[f"{path} {name}"] = type(e).__name__
        print(json.dumps(outcome))
    """, *HOSTILE, timeout=300)
    assert not os.path.exists(marker), "a pickle's code ran"
    loaded = [k for k, v in got.items() if v == "loaded"]
    assert not loaded, loaded
    assert len(got) == 2 * len(HOSTILE)
