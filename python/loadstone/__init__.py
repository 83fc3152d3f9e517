"""loadstone: stream checkpoints into memory as fast as the hardware allows.

    import loadstone
    handle = loadstone.Loader().load("model.safetensors", dtype="bfloat16")   # returns at once
    first = handle.tensor("model.embed_tokens.weight").result()            # a loadstone.Tensor
    tensors = handle.result()                                               # {name: Tensor}

Tensors are loadstone.Tensor objects that speak DLPack: torch.from_dlpack(t),
numpy.from_dlpack(t) or jax.dlpack.from_dlpack(t) take them without a copy. This package does
not import torch; ``loadstone.torch`` does (load_file, load_state_dict, load_into,
load_checkpoint_and_dispatch, weights_iterator, describe). ``loadstone.safe_open`` is
safetensors.safe_open's drop-in.
"""
from ._core import MOSTLY_CACHED, Checkpoint, Plan, Tensor, __version__, cached_fraction
from ._core import platform as _platform
from ._errors import (
    CallbackError,
    CancelledError,
    CorruptionError,
    Error,
    InputOutputError,
    InvalidArgumentError,
    NotFoundError,
    OutOfMemoryError,
    UnsupportedError,
)
from ._loader import Loader
from ._loads import LoadHandle, Progress, TensorFuture, default_loader
from ._patches import patch_diffusers, patch_transformers
from ._safe_open import safe_open


def plan(checkpoint, *, variant=None, subfolder=None, **options):
    """What a load of `checkpoint` would do (device map, per-tensor device, dtype and
    conversion, reads), without loading: a loadstone.Plan."""
    return default_loader().plan(checkpoint, variant=variant, subfolder=subfolder, **options)


def platform():
    """This machine as loadstone sees it: GPUs and their free memory, available host memory."""
    return _platform(None)


__all__ = [
    "Checkpoint",
    "Plan",
    "Tensor",
    "Loader",
    "LoadHandle",
    "Progress",
    "TensorFuture",
    "default_loader",
    "safe_open",
    "plan",
    "platform",
    "cached_fraction",
    "MOSTLY_CACHED",
    "patch_diffusers",
    "patch_transformers",
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "CorruptionError",
    "InputOutputError",
    "OutOfMemoryError",
    "UnsupportedError",
    "CancelledError",
    "CallbackError",
    "__version__",
]
