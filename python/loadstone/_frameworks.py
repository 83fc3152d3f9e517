"""loadstone.Tensor → torch / numpy arrays, zero-copy (DLPack); torch and numpy imported lazily."""


def framework_name(framework):
    """safetensors' framework argument → "pt" or "np"; others are refused."""
    name = str(framework)
    if name in ("pt", "torch", "pytorch"):
        return "pt"
    if name in ("np", "numpy"):
        return "np"
    from ._errors import UnsupportedError

    raise UnsupportedError(
        f"framework {name!r}: loadstone hands tensors to torch ('pt') and numpy ('np'); others "
        "take loadstone.Tensor through their own from_dlpack"
    )


def torch_dtype(name):
    """The torch dtype called `name` ("bfloat16", "float8_e4m3fn", ...)."""
    import torch

    if name.startswith("float4_e2m1fn"):  # safetensors' F4: torch packs two a float4_e2m1fn_x2
        name = "float4_e2m1fn_x2"
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        from ._errors import UnsupportedError

        raise UnsupportedError(f"this torch ({torch.__version__}) has no dtype {name}")
    return dtype


def to_torch(tensor):
    """A torch.Tensor over the loadstone.Tensor's memory (no copy; the memory lives as long as the
    torch tensor). Types DLPack 1.0 has no code for (float8, float4) come as the tensor's bytes
    viewed as the torch dtype."""
    import torch

    if any(d >= 1 << 63 for d in tensor.shape):
        from ._errors import UnsupportedError

        raise UnsupportedError(f"tensor {tensor.name!r} has shape {list(tensor.shape)}: torch "
                               "holds dimensions below 2^63 only")
    try:
        return torch.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError):
        pass
    dtype = torch_dtype(tensor.dtype)
    raw = torch.from_dlpack(tensor.as_bytes())
    if tensor.dtype.startswith("float4"):  # two values a byte: torch's shape is halved
        shape = list(tensor.shape)
        if not shape or shape[-1] % 2:
            from ._errors import UnsupportedError

            raise UnsupportedError(
                f"tensor {tensor.name!r} is float4 of shape {shape}: torch holds float4 two a "
                "byte (float4_e2m1fn_x2), so its last dimension must be even")
        shape[-1] //= 2
        return raw.view(dtype).reshape(shape)
    return raw.view(dtype)


def to_numpy(tensor):
    """A numpy array over the loadstone.Tensor's memory (no copy); numpy has no bfloat16 or
    float8: those raise UnsupportedError (take them as torch tensors, or .as_bytes())."""
    import numpy

    try:
        return numpy.from_dlpack(tensor)
    except (BufferError, RuntimeError, TypeError) as e:
        from ._errors import UnsupportedError

        raise UnsupportedError(
            f"tensor {tensor.name!r} is {tensor.dtype}, which numpy cannot hold ({e}); use "
            "framework='pt' or tensor.as_bytes()"
        ) from None


def converter(framework):
    return to_torch if framework_name(framework) == "pt" else to_numpy
