"""loadstone.torch.describe(model) against accelerate: the description of a live module, written
to a file and planned by the C++ CLI (`loadstone plan --model-json FILE ... --json`), gives the
map accelerate.infer_auto_device_map gives for the module itself — the text of json.dumps of it,
keys in order — for the tiny models of test_dispatch.py, GPU and cpu + disk budgets, no-split
classes from the command line, from the description and none, a float16 target, and the string
modes (accelerate.load_checkpoint_and_dispatch's get_balanced_memory + infer_auto_device_map).

`python -m loadstone describe CLASS CONFIG` builds CLASS from CONFIG on the meta device and writes
the description describe() gives for the model built from that config; -o refuses an existing
file without --overwrite and leaves it untouched.
"""
import json
import os
import pathlib
import stat
import subprocess
import sys

import accelerate
import pytest
import torch
from accelerate.utils import find_tied_parameters

import loadstone.__main__ as cli_main
import loadstone.torch as lt
from conftest import ROOT
from test_dispatch import TINY, accelerate_map, accelerate_plan, budgets, model, own_no_split

pytestmark = pytest.mark.filterwarnings("ignore:no-split entry:UserWarning")

CLI = pathlib.Path(os.environ.get("LOADSTONE_CLI", ROOT / "build" / "loadstone"))


def plan(description, *flags):
    """`loadstone plan --model-json FILE FLAGS --json` on `description`: its device_map."""
    if not CLI.exists():
        pytest.skip(f"the loadstone CLI is not built ({CLI}; LOADSTONE_CLI names another)")
    return json.loads(run_plan(description, *flags).stdout)["device_map"]


def run_plan(description, *flags):
    done = subprocess.run([str(CLI), "plan", "--model-json", str(description), *flags, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def max_memory_flag(max_memory):
    return ",".join(f"{device}={size}" for device, size in max_memory.items())


def no_split_flags(classes):
    if not classes:
        return ["--no-split", "none"]
    return [arg for c in classes for arg in ("--no-split", c)]


@pytest.fixture(scope="module")
def described(tmp_path_factory):
    """described(name, **options): describe(TINY[name]'s model) written to a file (once)."""
    folder = tmp_path_factory.mktemp("described")
    written = {}

    def get(name, **options):
        key = (name, tuple(sorted(options.items(), key=str)))
        if key not in written:
            path = folder / f"{name}-{len(written)}.json"
            path.write_text(lt.describe_json(model(name), **options))
            written[key] = path
        return written[key]

    return get


BUDGETS = {
    "gpus": {0: 0.25, 1: 0.3, "cpu": 0.25},
    "gpu-cpu-disk": {0: 0.3, "cpu": 0.3},
    "cpu-disk": {"cpu": 0.5},
}
DTYPES = {"own": None, "f16": torch.float16}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("no_split", ["own", "none"])
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", TINY)
def test_plan_on_the_description_is_accelerates_map(described, name, budget, no_split, dtype):
    m = model(name)
    classes = own_no_split(m) if no_split == "own" else []
    max_memory = budgets(m, BUDGETS[budget], dtype)
    expected = accelerate_map(m, max_memory, no_split_module_classes=classes, dtype=dtype)
    flags = ["--max-memory", max_memory_flag(max_memory), "--device-map", "sequential",
             *no_split_flags(classes), *(["--dtype", "f16"] if dtype else [])]
    assert json.dumps(plan(described(name), *flags)) == json.dumps(expected)


@pytest.mark.parametrize("mode", ["auto", "balanced", "balanced_low_0"])
@pytest.mark.parametrize("name", TINY)
def test_string_modes_on_the_description(described, name, mode):
    m = model(name)
    for shares in ({0: 0.3, 1: 0.3, 2: 0.3, "cpu": 0.5}, {0: 0.2, 1: 0.5, "cpu": 0.3}):
        max_memory = budgets(m, shares)
        expected = accelerate_plan(m, mode, max_memory, own_no_split(m), None)
        got = plan(described(name), "--max-memory", max_memory_flag(max_memory),
                   "--device-map", mode)
        assert json.dumps(got) == json.dumps(expected), shares


@pytest.mark.parametrize("name", TINY)
def test_the_descriptions_own_fields_plan_as_given(described, name):
    """No flags but the budgets: the description's no_split (the model's own classes) and its
    dtype are what the plan uses."""
    m = model(name)
    max_memory = budgets(m, BUDGETS["gpu-cpu-disk"], torch.float16)
    expected = accelerate_map(m, max_memory, no_split_module_classes=own_no_split(m),
                              dtype=torch.float16)
    got = plan(described(name, dtype=torch.float16), "--max-memory", max_memory_flag(max_memory),
               "--device-map", "sequential")
    assert json.dumps(got) == json.dumps(expected)


@pytest.mark.parametrize("name", TINY)
def test_description_fields_are_the_models(name):
    m = model(name)
    doc = lt.describe(m)
    assert sorted(doc["no_split"]) == own_no_split(m)
    ties = sorted(sorted(group) for group in doc.get("tied", []))
    assert ties == sorted(sorted(group) for group in find_tied_parameters(m))
    assert (name == "llama-tied") == bool(ties)
    names = []

    def walk(node, prefix):
        for p in node.get("params", []):
            names.append(prefix + p["name"])
        for child in node.get("children", []):
            walk(child, prefix + child["name"] + ".")
        for b in node.get("buffers", []):
            names.append(prefix + b["name"])

    walk(doc["modules"], "")
    # every parameter and buffer under each of its names, a tied one too
    expected = [n for n, _ in m.named_parameters(remove_duplicate=False)]
    expected += [n for n, _ in m.named_buffers(remove_duplicate=False)]
    assert sorted(names) == sorted(expected)


@pytest.mark.parametrize("name", TINY)
def test_a_model_on_the_meta_device_describes_as_the_real_one(name):
    with accelerate.init_empty_weights():
        empty = TINY[name].build()
    if TINY[name].is_transformers:
        empty.tie_weights()
    assert lt.describe(empty) == lt.describe(model(name))
    with torch.device("meta"):
        on_meta = TINY[name].build()
    assert lt.describe(on_meta) == lt.describe(model(name))


# --- python -m loadstone describe ---------------------------------------------------------------

def python_m_loadstone(*args):
    """`python -m loadstone ARGS` in a child (this interpreter, this environment)."""
    return subprocess.run([sys.executable, "-m", "loadstone", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ))


def config_folder(name, folder):
    """TINY[name]'s config saved as its library saves it: the folder holding config.json."""
    m = model(name)
    if TINY[name].is_transformers:
        m.config.save_pretrained(folder)
    else:
        m.save_config(folder)
    return folder


def test_python_m_loadstone_describe_a_unet(tmp_path):
    config = config_folder("unet", tmp_path / "unet")
    done = python_m_loadstone("describe", "diffusers.UNet2DConditionModel", config)
    assert done.returncode == 0, done.stderr
    cls = TINY["unet"].cls
    assert json.loads(done.stdout) == lt.describe(cls.from_config(cls.load_config(config)))
    assert json.loads(done.stdout) == lt.describe(model("unet"))


def test_python_m_loadstone_describe_a_llama_to_a_file(tmp_path):
    config = config_folder("llama-tied", tmp_path / "llama") / "config.json"
    out = tmp_path / "llama.json"
    done = python_m_loadstone("describe", "transformers.LlamaForCausalLM", config, "-o", out,
                              "--dtype", "float16", "--no-split", "LlamaDecoderLayer",
                              "--no-split", "LlamaRMSNorm")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    expected = lt.describe(model("llama-tied"), dtype="float16",
                           no_split=["LlamaDecoderLayer", "LlamaRMSNorm"])
    assert json.loads(out.read_text()) == expected
    assert expected["tied"] == [["model.embed_tokens.weight", "lm_head.weight"]]


def test_output_refuses_an_existing_file_without_overwrite(tmp_path):
    config = config_folder("vae", tmp_path / "vae")
    out = tmp_path / "vae.json"
    out.write_text("mine\n")
    done = python_m_loadstone("describe", "diffusers.AutoencoderKL", config, "-o", out)
    assert done.returncode != 0
    assert "exists" in done.stderr and "--overwrite" in done.stderr
    assert out.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vae", "vae.json"]  # no leftovers

    assert cli_main.main(["describe", "diffusers.AutoencoderKL", str(config), "-o", str(out),
                          "--overwrite"]) == 0
    assert json.loads(out.read_text()) == lt.describe(model("vae"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vae", "vae.json"]


def test_the_written_file_has_the_mode_of_any_new_file(tmp_path):
    config = config_folder("sd3", tmp_path / "sd3")
    out = tmp_path / "sd3.json"
    assert cli_main.main(["describe", "diffusers.SD3Transformer2DModel", str(config),
                          "-o", str(out)]) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_an_output_folder_that_does_not_exist_is_one_error_line(tmp_path):
    config = config_folder("sd3", tmp_path / "sd3")
    with pytest.raises(SystemExit) as caught:
        cli_main.main(["describe", "diffusers.SD3Transformer2DModel", str(config),
                       "-o", str(tmp_path / "missing" / "sd3.json")])
    assert str(caught.value).startswith("error: ")


def test_a_class_that_is_not_module_dot_class(tmp_path):
    config = config_folder("sd3", tmp_path / "sd3")
    with pytest.raises(SystemExit) as caught:
        cli_main.main(["describe", "SD3Transformer2DModel", str(config)])
    assert "module.Class" in str(caught.value)
