"""safe_open: safetensors.safe_open's interface over loadstone's loads.

Same names, arguments and results as safetensors 0.8: a context manager with keys() (sorted),
offset_keys(), metadata(), get_tensor(), get_tensors() and get_slice(name)[...]. Differences:
tensors own their memory (read through loadstone, not a mapping of the file, unless
backend="mmap"); a slice reads only the bytes it selects; errors are loadstone.Error subclasses.
"""
import math
import os
import threading

from ._errors import InvalidArgumentError, NotFoundError
from ._frameworks import converter, framework_name, torch_dtype
from ._loader import Loader, device_name, make_plan, open_checkpoint
from ._loads import default_loader

# A selection read as more runs than this is read as fewer, longer ones (outer dimensions taken
# whole): one read per selected row would cost more in requests than the bytes it saves.
_MAX_RUNS = 4096

_loaders = {}
_loaders_lock = threading.Lock()


def loader_for(backend):
    """The shared Loader for a backend: None / "auto" / "mmap" the default one, "pread" and
    "uring" their own."""
    if backend in (None, "auto", "mmap"):
        return default_loader()
    if backend in ("pread", "uring", "io_uring"):
        with _loaders_lock:
            if backend not in _loaders:
                _loaders[backend] = Loader(backend="uring" if backend == "io_uring" else backend)
            return _loaders[backend]
    raise InvalidArgumentError(
        f'backend {backend!r} is invalid (expected one of: None, "auto", "uring", "pread", "mmap")')


def reading(backend):
    """How a backend reads: its Loader (loader_for) and the plan options it asks for ("mmap":
    CPU tensors point into a private mapping of the file)."""
    return loader_for(backend), ({"mmap": True} if backend == "mmap" else {})


class _Selection:
    """A basic index (ints, slices with positive steps, Ellipsis, None) resolved against a shape:
    per dimension (start, count, step), which dimensions it removes (ints), where it adds ones
    (None)."""

    def __init__(self, key, shape):
        if not isinstance(key, tuple):
            key = (key,)
        consuming = [k for k in key if k is not Ellipsis and k is not None]
        if any(not _basic(k) for k in consuming) or sum(k is Ellipsis for k in key) > 1:
            raise _NotBasic
        if len(consuming) > len(shape):
            raise _NotBasic  # the framework raises its own IndexError
        expanded = []
        for k in key:
            if k is Ellipsis:
                expanded.extend([slice(None)] * (len(shape) - len(consuming)))
            else:
                expanded.append(k)
        expanded.extend([slice(None)] * (len(shape) - sum(k is not None for k in expanded)))
        self.key = expanded  # one entry per dimension, plus the Nones
        self.dims = []  # (start, count, step, is_int) per tensor dimension
        d = 0
        for k in expanded:
            if k is None:
                continue
            size = shape[d]
            if isinstance(k, slice):
                start, stop, step = k.indices(size)
                if step <= 0:
                    raise _NotBasic
                count = max(0, (stop - start + step - 1) // step)
                self.dims.append((start, count, step, False))
            else:
                i = int(k)
                if i < -size or i >= size:
                    raise _NotBasic  # out of range: the framework's IndexError
                self.dims.append((i % size, 1, 1, True))
            d += 1


class _NotBasic(Exception):
    pass


def _basic(k):
    if isinstance(k, bool):
        return False
    if isinstance(k, slice):
        return all(v is None or (isinstance(v, int) and not isinstance(v, bool))
                   for v in (k.start, k.stop, k.step))
    return isinstance(k, int) or (hasattr(k, "__index__") and not hasattr(k, "shape"))


def _plan_runs(sel, shape, itemsize):
    """Byte runs (offset, length) covering the selection, in C order, and the shape the
    concatenated runs have: dimensions before `k` as selected, dimension `k` as the span from
    its first to its last selected index, the rest whole."""
    ndim = len(shape)
    strides = [itemsize] * ndim
    for d in range(ndim - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    k = ndim - 1
    while k >= 0:  # the dimensions after k are whole
        start, count, step, _ = sel.dims[k]
        if not (start == 0 and count == shape[k] and step == 1):
            break
        k -= 1
    if k < 0:
        return [(0, math.prod(shape) * itemsize)], list(shape), 0
    while k > 0 and math.prod(c for _, c, _, _ in sel.dims[:k]) > _MAX_RUNS:
        k -= 1
    start_k, count_k, step_k, _ = sel.dims[k]
    span = (count_k - 1) * step_k + 1
    run = span * strides[k]
    runs = [0]
    for d in range(k):
        start, count, step, _ = sel.dims[d]
        runs = [base + (start + i * step) * strides[d] for base in runs for i in range(count)]
    runs = [(base + start_k * strides[k], run) for base in runs]
    read_shape = [c for _, c, _, _ in sel.dims[:k]] + [span] + list(shape[k + 1:])
    return runs, read_shape, k


class PySafeSlice:
    """safe_open(...).get_slice(name): shape and dtype without reading; [index] reads the bytes
    the index selects (basic indexing; any other index reads the tensor and lets the framework
    index it)."""

    def __init__(self, owner, info):
        self._owner = owner
        self._info = info

    def get_shape(self):
        return list(self._info["shape"])

    def get_dtype(self):
        return self._info["safetensors_dtype"]

    def __getitem__(self, key):
        return self._owner._slice(self._info, key)


class safe_open:  # noqa: N801  (safetensors' name)
    """Opens a checkpoint lazily (its header only) and hands out tensors as asked.

    filename: a .safetensors file (any checkpoint loadstone opens works: an index, a folder, a
    .bin, a GGUF file). framework: "pt" (torch) or "np" (numpy). device: "cpu", "cuda",
    "cuda:N" or N. backend: None (loadstone's reads into memory the tensor owns), "pread",
    "uring", or "mmap" (CPU tensors point into a private mapping of the file, as safetensors').
    prefetch: start reading every tensor now (what a caller that reads them all wants).
    """

    def __init__(self, filename, framework, device="cpu", *, backend=None, prefetch=False):
        self._framework = framework_name(framework)
        self._convert = converter(self._framework)
        self._device = device_name(device) or "cpu"
        if self._framework == "np" and self._device != "cpu":
            raise InvalidArgumentError(f"Device {self._device} is not supported for framework numpy")
        reading(backend)  # checks the name
        self._backend = backend
        self._ckpt = open_checkpoint(os.fspath(filename), as_stored=True)
        self._infos = {i["name"]: i for i in self._ckpt.infos()}
        self._prefetched = None
        self._closed = False
        self.bytes_read = 0  # bytes the loads of this object read from storage
        if prefetch:
            loader, options = reading(backend)
            plan = make_plan(self._ckpt, device=self._device, **options)
            self.bytes_read += plan.read_bytes
            self._prefetched = loader.start(plan, self._ckpt.keys(), progress=False)

    # ---- safetensors' interface ----------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._prefetched is not None and not self._prefetched.done():
            self._prefetched.cancel()
        self._prefetched = None
        self._closed = True

    def keys(self):
        self._check_open()
        return sorted(self._infos)

    def offset_keys(self):
        self._check_open()
        return self._ckpt.keys()

    def metadata(self):
        self._check_open()
        return dict(self._ckpt.metadata) or None

    def get_tensor(self, name):
        self._info(name)  # checks the file is open and holds the tensor
        if self._prefetched is not None:
            return self._convert(self._prefetched.wait_tensor(name))
        return self._convert(self._load([name])[name])

    def get_tensors(self):
        self._check_open()
        if self._prefetched is not None:
            loaded = self._prefetched.result()
        else:
            loaded = self._load(None)
        return {n: self._convert(loaded[n]) for n in self._ckpt.keys() if n in loaded}

    def get_slice(self, name):
        return PySafeSlice(self, self._info(name))

    # ---- loadstone's -----------------------------------------------------------------------------

    @property
    def checkpoint(self):
        return self._ckpt

    def _check_open(self):
        if self._closed:
            raise InvalidArgumentError("File is closed")

    def _info(self, name):
        self._check_open()
        info = self._infos.get(name)
        if info is None:
            raise NotFoundError(f"File does not contain tensor {name}")
        return info

    def _load(self, names, ckpt=None, device=None):
        ckpt = ckpt or self._ckpt
        loader, options = reading(self._backend)
        if names is not None:
            options["include"] = list(names)
        plan = make_plan(ckpt, device=device or self._device, **options)
        self.bytes_read += plan.read_bytes
        return loader.start(plan, ckpt.keys(), progress=False).result()

    def _slice(self, info, key):
        if self._prefetched is not None or not info["plain"] or info["packed"] is not None:
            return self._index_whole(info, key)
        shape = info["shape"]
        itemsize_bits = info["bits"]
        if itemsize_bits % 8:
            return self._index_whole(info, key)
        try:
            sel = _Selection(key, shape)
        except _NotBasic:
            return self._index_whole(info, key)
        if self._framework == "pt" and any(c == 0 for _, c, _, _ in sel.dims):
            import torch  # an empty selection: its shape, nothing read

            empty = torch.empty((), dtype=torch_dtype(info["dtype"])).expand(shape)[key]
            return empty.contiguous().to(self._device)
        itemsize = itemsize_bits // 8
        runs, read_shape, k = _plan_runs(sel, shape, itemsize)
        views = [{"name": f"{info['name']}@{i}", "dtype": "uint8", "shape": [n],
                  "file": info["file"], "offset": info["offset"] + off, "nbytes": n}
                 for i, (off, n) in enumerate(runs)]
        loaded = self._load(None, ckpt=self._ckpt.view(views), device="cpu")
        parts = [loaded[v["name"]] for v in views]
        relative = []
        d = 0
        for entry in sel.key:
            if entry is None:
                relative.append(None)
                continue
            start, count, step, is_int = sel.dims[d]
            if d < k:
                relative.append(0 if is_int else slice(None))
            elif d == k:
                relative.append(0 if is_int else slice(0, (count - 1) * step + 1, step))
            else:
                relative.append(slice(None))
            d += 1
        return self._assemble(parts, info["dtype"], read_shape, tuple(relative))

    def _assemble(self, parts, dtype, read_shape, relative):
        if self._framework == "pt":
            import torch

            from ._frameworks import to_torch

            raw = [to_torch(p) for p in parts]
            flat = raw[0] if len(raw) == 1 else torch.cat(raw)
            out = flat.view(torch_dtype(dtype)).reshape(read_shape)[relative]
            return out.to(self._device) if self._device != "cpu" else out
        import numpy

        from ._frameworks import to_numpy

        raw = [to_numpy(p) for p in parts]
        flat = raw[0] if len(raw) == 1 else numpy.concatenate(raw)
        return flat.view(numpy.dtype(dtype)).reshape(read_shape)[relative]

    def _index_whole(self, info, key):
        return self.get_tensor(info["name"])[key]


__all__ = ["safe_open", "PySafeSlice"]
