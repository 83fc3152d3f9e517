"""Loader: the long-lived object every load goes through (reuse one; it is thread-safe)."""
import os

from . import _core
from ._loads import LoadHandle


def open_checkpoint(checkpoint, variant=None, subfolder=None, as_stored=False):
    """A _core.Checkpoint for a path (file, index, folder), or the one given. as_stored: every
    tensor as the file stores it (safetensors' view: no quantized layout recognised)."""
    if isinstance(checkpoint, _core.Checkpoint):
        return checkpoint
    return _core.Checkpoint.open(os.fspath(checkpoint), variant or "", subfolder or "", as_stored)


def device_name(device):
    """safetensors' device argument ("cpu", "cuda:1", 1, torch.device) as loadstone's text."""
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    return str(device)


def make_plan(ckpt, *, device=None, **options):
    """_core.plan with None-valued options left out; `device` is a one-device map."""
    if device is not None:
        if options.get("device_map") is not None:
            raise TypeError("give device or device_map, not both")
        options["device_map"] = device_name(device)
    return _core.plan(ckpt, **{k: v for k, v in options.items() if v is not None})


class Loader:
    """Streams checkpoints into memory. Long-lived, reusable, thread-safe: several loads (from
    several threads) may run at once.

    Options: backend ("auto", "uring", "pread"), queue_depth (reads in flight), worker_threads
    (conversion workers; 0 = one per core), staging_bytes (the staging pool per load, which bounds
    host memory in flight), direct_io (O_DIRECT where possible), platform (None: this machine),
    bytes_in_flight (at most this many bytes of reads in the kernel's hands at once; 0: no bound
    but queue_depth pieces of 4 MiB; the handle's backend line says "at most N MiB in flight").
    """

    def __init__(self, *, backend="auto", queue_depth=32, worker_threads=0,
                 staging_bytes=256 << 20, direct_io=True, platform=None, bytes_in_flight=0):
        self._core = _core.Loader(backend, queue_depth, worker_threads, staging_bytes, direct_io,
                                  platform, bytes_in_flight)

    @property
    def platform(self):
        return self._core.platform

    def plan(self, checkpoint, *, variant=None, subfolder=None, **options):
        """The plan of a load (what load() would do), without loading."""
        return make_plan(open_checkpoint(checkpoint, variant, subfolder), **options)

    def load(self, checkpoint, *, variant=None, subfolder=None, progress=None, trace=False,
             host_memory_limit=0, destinations=None, **options):
        """Starts loading `checkpoint` (a path or a loadstone.Checkpoint) and returns a LoadHandle
        at once. Options are the plan's: device ("cpu", "cuda:0", 0) or device_map ("auto",
        "balanced", "sequential", a dict), dtype, max_memory, no_split, keep_in_fp32,
        special_dtypes, include (names), keep_packed, mmap, offload_folder, order ("execution",
        the default: the order the model runs; "file"; or a list of module prefixes read first),
        ... Tensors the map sends to "disk" are not loaded (write_offload writes them).

        progress: a tqdm bar while a wait runs (None: when tqdm is installed and stderr is a
        terminal). destinations: {name: (address, nbytes)} of memory the caller owns and keeps
        valid until the load ends, for tensors planned with caller_memory."""
        ckpt = open_checkpoint(checkpoint, variant, subfolder)
        plan = make_plan(ckpt, **options)
        return self.start(plan, ckpt.keys(), progress=progress, trace=trace,
                          host_memory_limit=host_memory_limit, destinations=destinations)

    def start(self, plan, names, *, progress=None, trace=False, host_memory_limit=0,
              destinations=None, desc="loadstone"):
        """Starts the load of a plan made already; `names` orders result()."""
        core = self._core.load(plan, destinations, trace, host_memory_limit)
        return LoadHandle(core, plan, names, progress=progress, desc=desc)

    def write_offload(self, plan, batch_bytes=256 << 20):
        """Writes the plan's disk tensors into its offload folder (accelerate's format: index.json
        and NAME.dat; plain safetensors tensors referenced in place). Returns a summary dict."""
        return self._core.write_offload(plan, batch_bytes)

    def cancel_all(self):
        """Cancels every load of this Loader (returns at once)."""
        self._core.cancel_all()
