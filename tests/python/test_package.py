"""The installed package as a user gets it: `import loadstone` from any folder, with no
LD_LIBRARY_PATH, imports no torch; the wheel carries libloadstone beside its extension and links
no LibTorch; `python -m loadstone` answers --help and refuses a bad class with one line."""
import os
import pathlib
import subprocess
import sys

import loadstone


def run(code, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_import_needs_no_torch_and_no_library_path(tmp_path):
    done = run("import sys, loadstone; print(loadstone._core.__file__); "
               "print('torch' in sys.modules, 'numpy' in sys.modules)", tmp_path)
    assert done.returncode == 0, done.stderr
    where, imported = done.stdout.split("\n")[:2]
    assert imported == "False False"
    folder = pathlib.Path(where).parent
    assert (folder / "libloadstone.so.0.1").exists()
    assert pathlib.Path(loadstone.__file__).parent == folder  # one folder: the package


def test_the_extension_links_no_torch_and_finds_libloadstone_beside_it():
    core = pathlib.Path(loadstone._core.__file__)
    needed = subprocess.run(["readelf", "-dW", str(core)], capture_output=True, text=True).stdout
    assert "libloadstone.so.0.1" in needed
    assert "$ORIGIN" in needed
    lib = subprocess.run(["readelf", "-dW", str(core.parent / "libloadstone.so.0.1")],
                         capture_output=True, text=True).stdout
    for name in (needed, lib):
        assert "libtorch" not in name and "libc10" not in name


def test_python_m_loadstone(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    helped = subprocess.run([sys.executable, "-m", "loadstone", "describe", "--help"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "CLASS" in helped.stdout
    bad = subprocess.run([sys.executable, "-m", "loadstone", "describe", "nope.Nothing", "x"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    assert bad.stderr.strip().startswith("error: cannot import nope.Nothing")
    assert "Traceback" not in bad.stderr
