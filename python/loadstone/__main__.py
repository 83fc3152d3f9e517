"""python -m loadstone describe CLASS CONFIG [-o model.json] [--overwrite]

Builds CLASS (a diffusers or transformers model class, or any torch.nn.Module class whose
from_config / constructor takes the config) from CONFIG (a config.json, or the folder holding
it) on the meta device — no weights, no memory — and writes the model description
`loadstone plan --model-json` takes: module classes, registration order, buffers, ties,
_no_split_modules. Without -o it prints it. An existing output is replaced only with
--overwrite; the file appears whole or not at all.
"""
import argparse
import importlib
import json
import os
import sys
import tempfile


def _class(dotted):
    module, _, name = dotted.rpartition(".")
    if not module:
        raise SystemExit(f"error: CLASS must be module.Class (e.g. diffusers.UNet2DConditionModel), "
                         f"not {dotted!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise SystemExit(f"error: cannot import {dotted}: {e}") from None


def _config(path):
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise SystemExit(f"error: cannot read the config {path}: {e.strerror}") from None
    except ValueError as e:
        raise SystemExit(f"error: {path} is not JSON: {e}") from None


def build_on_meta(cls, config):
    """An instance of `cls` from the config dict, its tensors on the meta device."""
    import torch

    with torch.device("meta"):
        if hasattr(cls, "config_class") and hasattr(cls, "_from_config"):  # transformers
            return cls._from_config(cls.config_class.from_dict(config))
        if hasattr(cls, "from_config"):  # diffusers (ConfigMixin)
            return cls.from_config(config)
        return cls(**config)


def _write(text, out, overwrite):
    """Writes `text` to `out` whole (beside it, then renamed) with a new file's mode."""
    out = os.path.abspath(out)
    if os.path.exists(out) and not overwrite:
        raise SystemExit(f"error: {out} exists; pass --overwrite to replace it")
    folder = os.path.dirname(out)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out)}.", dir=folder)
    except OSError as e:
        raise SystemExit(f"error: cannot write {out}: {e.strerror}") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, out)
    except OSError as e:
        os.unlink(tmp)
        raise SystemExit(f"error: cannot write {out}: {e.strerror}") from None
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m loadstone", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("describe", help="a model class + config as a model description (JSON)")
    d.add_argument("cls", metavar="CLASS", help="e.g. diffusers.UNet2DConditionModel")
    d.add_argument("config", metavar="CONFIG", help="config.json, or the folder holding it")
    d.add_argument("-o", "--output", help="write here instead of standard output")
    d.add_argument("--overwrite", action="store_true", help="replace an existing output")
    d.add_argument("--dtype", help="the target dtype the sizes use (float16, bfloat16, ...)")
    d.add_argument("--no-split", action="append", metavar="CLASS",
                   help="classes never split (default: the model's _no_split_modules)")
    args = parser.parse_args(argv)

    from .torch import describe

    model = build_on_meta(_class(args.cls), _config(args.config))
    doc = describe(model, no_split=args.no_split, dtype=args.dtype)
    text = json.dumps(doc, indent=1) + "\n"
    if args.output:
        _write(text, args.output, args.overwrite)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
