"""patch_diffusers() and patch_transformers(): from_pretrained reads its weights through loadstone.

Each works as a plain call (patched until unpatch() or the end of the process) and as a context
manager (patched inside the block only):

    with loadstone.patch_diffusers():
        unet = UNet2DConditionModel.from_pretrained("sd/unet")

A file already in the page cache is mapped, as the library's own reader maps it (a copy could
only be slower); a cold one is read by loadstone. Only the function that reads a checkpoint
file into a state dict is replaced; everything
from_pretrained does with the state dict (dtypes, keep-in-fp32 modules, device maps, offload,
missing keys) is the library's own, so the model is the one it would build. Files loadstone
does not read (GGUF for diffusers' quantizer, anything on the meta device) go to the original.
"""
import os
import threading
import zipfile

from . import _core

_lock = threading.Lock()
# (owner, attribute) -> [the original, how many patches hold it]: the first patch installs the
# wrapper, the last one undone puts the original back, in whatever order they are undone.
_installed = {}


class _Patch:
    """Installs wrappers now (once per attribute, however many patches ask); restores the
    originals when the last patch holding them is undone (unpatch(), or the end of a `with`)."""

    def __init__(self, targets):
        self._held = []
        with _lock:
            for owner, name, make in targets:
                key = (owner, name)
                if key not in _installed:
                    original = getattr(owner, name)
                    _installed[key] = [original, 0]
                    setattr(owner, name, make(original))
                _installed[key][1] += 1
                self._held.append(key)

    def unpatch(self):
        with _lock:
            for key in self._held:
                entry = _installed[key]
                entry[1] -= 1
                if entry[1] == 0:
                    setattr(key[0], key[1], entry[0])
                    del _installed[key]
            self._held = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unpatch()
        return False


def _reads(checkpoint_file, map_location):
    """True for a file loadstone reads for from_pretrained: a safetensors file or a torch.save zip
    archive, loaded onto a real device."""
    if isinstance(checkpoint_file, dict) or str(map_location) == "meta":
        return False
    path = os.fspath(checkpoint_file)
    return path.endswith(".safetensors") or (os.path.isfile(path) and zipfile.is_zipfile(path))


def backend_for(path, device):
    """The patches' one rule for reading a checkpoint file: a file mostly in the page cache
    (loadstone.MOSTLY_CACHED of its pages) is mapped, as the library's own reader maps it — a copy
    could only be slower than a mapping of pages already in memory; any other is read by
    loadstone (io_uring, O_DIRECT), into memory its tensors own."""
    if str(device) != "cpu":
        return None
    return "mmap" if _core.cached_fraction(path) >= _core.MOSTLY_CACHED else None


def _state_dict(checkpoint_file, map_location):
    from .torch import load_file

    device = str(map_location) if map_location else "cpu"
    return load_file(checkpoint_file, device=device, backend=backend_for(checkpoint_file, device),
                     progress=False)


def patch_diffusers():
    """diffusers' load_state_dict (every checkpoint file from_pretrained reads, whole or one
    shard at a time) reads through loadstone."""
    from diffusers.models import model_loading_utils, modeling_utils

    def make(original):
        def load_state_dict(checkpoint_file, disable_mmap=False, map_location="cpu", *a, **kw):
            if a or kw or not _reads(checkpoint_file, map_location):
                return original(checkpoint_file, disable_mmap, map_location, *a, **kw)
            return _state_dict(checkpoint_file, map_location)

        load_state_dict.__wrapped__ = original
        return load_state_dict

    return _Patch([(model_loading_utils, "load_state_dict", make),
                   (modeling_utils, "load_state_dict", make)])


def patch_transformers():
    """transformers' checkpoint reads go through loadstone: its safe_open (every safetensors
    shard from_pretrained opens, each read whole as soon as it is opened, since from_pretrained
    reads every tensor) and its load_state_dict (.bin files)."""
    from transformers import modeling_utils

    from ._safe_open import safe_open as loadstone_safe_open

    def make_safe_open(original):
        def safe_open(filename, framework="pt", device="cpu", *a, backend=None, **kw):
            if a or kw or str(framework) not in ("pt", "torch", "pytorch") or str(device) != "cpu":
                return original(filename, framework, device, *a, backend=backend or "mmap", **kw)
            return loadstone_safe_open(filename, framework, device, prefetch=True,
                                       backend=backend_for(filename, device))

        safe_open.__wrapped__ = original
        return safe_open

    def make_load_state_dict(original):
        def load_state_dict(checkpoint_file, map_location="cpu", weights_only=True,
                            disable_mmap=None, *a, **kw):
            if a or kw or not weights_only or not _reads(checkpoint_file, map_location):
                return original(checkpoint_file, map_location, weights_only, disable_mmap, *a,
                                **kw)
            return _state_dict(checkpoint_file, map_location)

        load_state_dict.__wrapped__ = original
        return load_state_dict

    return _Patch([(modeling_utils, "safe_open", make_safe_open),
                   (modeling_utils, "load_state_dict", make_load_state_dict)])
