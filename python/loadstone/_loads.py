"""Loads that run while Python goes on: Loader, LoadHandle, futures, asyncio, progress, Ctrl-C."""
import asyncio
import atexit
import concurrent.futures
import os
import sys
import threading
import weakref
from dataclasses import dataclass

from ._errors import CancelledError

# How long one wait may block before Python looks at Ctrl-C and the progress bar again.
_SLICE = 0.05
# A load shows its progress bar once it has run this long (seconds): a quick one shows none.
_BAR_AFTER = 0.1


@dataclass(frozen=True)
class Progress:
    """Where a load stands. Bytes read from storage and bytes in place (after conversion)."""

    bytes_total: int
    bytes_read: int
    bytes_to_place: int
    bytes_placed: int
    tensors_total: int
    tensors_done: int
    seconds: float
    read_gbps: float
    eta_seconds: float


class TensorFuture(concurrent.futures.Future):
    """A concurrent.futures.Future that asyncio can also await without blocking its loop."""

    def __await__(self):
        return asyncio.wrap_future(self).__await__()


_live_handles = weakref.WeakSet()
_live_lock = threading.Lock()


def _progress_wanted(progress):
    if progress is not None:
        return bool(progress)
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") or os.environ.get("LOADSTONE_NO_PROGRESS"):
        return False
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Bar:
    """A tqdm bar over a load's placed bytes, drawn by the thread that waits (none without tqdm)."""

    def __init__(self, handle, wanted, desc):
        self._bar = None
        if not _progress_wanted(wanted):
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
        total = handle._core.progress()["bytes_to_place"]
        self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                         dynamic_ncols=True, leave=False)

    def update(self, core):
        if self._bar is not None:
            placed = core.progress()["bytes_placed"]
            self._bar.update(placed - self._bar.n)

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class LoadHandle:
    """One running load. Returned at once by Loader.load; the load goes on in loadstone's threads.

    - ``tensor(name)``: a TensorFuture resolving to that loadstone.Tensor when it is in place.
    - ``await handle`` / ``result()``: the whole load, as {name: Tensor} in the checkpoint's order.
    - ``as_completed()``: each Tensor as it lands.
    - ``progress``, ``cancel()``, ``backend``, ``read_stats``, ``write_trace(path)``.

    Every wait releases the GIL and notices Ctrl-C within 50 ms: KeyboardInterrupt cancels the
    load, waits until its memory is freed, and is raised. Dropping the handle cancels a load
    still running.
    """

    def __init__(self, core_handle, plan, names, progress=None, desc="loadstone"):
        self._core = core_handle
        self._plan = plan
        self._names = names  # the checkpoint's order of the planned tensors
        self._progress = progress
        self._desc = desc
        self._done = None
        self._bar = None  # drawn by the waiting thread (_wait)
        self._lock = threading.Lock()
        with _live_lock:
            _live_handles.add(self)

    # ---- waiting -------------------------------------------------------------------------------

    def _wait(self, step, timeout=None):
        """Calls step(slice) until it returns True or `timeout` passes, drawing the progress bar
        while it blocks; Ctrl-C cancels. The bar lives from the first wait that blocks until the
        load ends (or a wait is interrupted), across waits (as_completed's)."""
        try:
            waited = 0.0
            while True:
                s = _SLICE if timeout is None else min(_SLICE, max(timeout - waited, 0.0))
                if step(s):
                    self._draw_bar()
                    return True
                waited += s
                self._draw_bar()
                if timeout is not None and waited >= timeout:
                    return False
        except KeyboardInterrupt:
            self._close_bar()
            self.cancel()
            self._core.wait()
            raise

    def _draw_bar(self):
        """Shows the bar once the load has run for _BAR_AFTER seconds (a quick load draws none),
        updates it, and closes it when the load has ended."""
        if self._core.wait(0):
            self._close_bar()
            return
        if self._bar is None:
            if self._core.progress()["seconds"] < _BAR_AFTER:
                return
            self._bar = _Bar(self, self._progress, self._desc)
        self._bar.update(self._core)

    def _close_bar(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def wait(self, timeout=None):
        """Waits until the load has ended (or `timeout` seconds); True when it has."""
        return self._wait(lambda s: self._core.wait(s), timeout)

    def done(self):
        """True once the load has ended (succeeded, failed or was cancelled)."""
        return self._core.wait(0)

    def exception(self, timeout=None):
        """The load's exception (None when it succeeded), once it has ended."""
        if not self.wait(timeout):
            raise TimeoutError(f"the load did not end within {timeout} s")
        return self._core.error()

    def result(self, timeout=None):
        """Every tensor, {name: loadstone.Tensor} in the checkpoint's order; raises its error."""
        error = self.exception(timeout)
        if error is not None:
            raise error
        loaded = {t.name: t for t in self._core.tensors()}
        return {n: loaded[n] for n in self._names if n in loaded}

    def future(self):
        """A TensorFuture for the whole load, resolving to result()'s dict."""
        with self._lock:
            if self._done is None:
                fut = TensorFuture()
                fut.set_running_or_notify_cancel()

                def finished(error):
                    if fut.done():
                        return
                    if error is not None:
                        fut.set_exception(error)
                    else:
                        loaded = {t.name: t for t in self._core.tensors()}
                        fut.set_result({n: loaded[n] for n in self._names if n in loaded})

                self._done = fut
                self._core.on_done(finished)
            return self._done

    def __await__(self):
        return self.future().__await__()

    def tensor(self, name):
        """A TensorFuture: resolves to tensor `name` once it is in place, or holds the load's
        error. Unknown names raise loadstone.NotFoundError here."""
        fut = TensorFuture()
        fut.set_running_or_notify_cancel()

        def landed(error, tensor):
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(tensor)

        self._core.on_tensor_ready(name, landed)
        return fut

    def module(self, prefix):
        """A TensorFuture: resolves (to None) once every tensor of module `prefix` is in place —
        those named `prefix` or `prefix.…`; "" is every tensor — or holds the load's error. A
        prefix no tensor is under raises loadstone.NotFoundError here."""
        fut = TensorFuture()
        fut.set_running_or_notify_cancel()

        def ready(error):
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(None)

        self._core.on_module_ready(prefix, ready)
        return fut

    def on_modules(self, callback):
        """Calls callback(prefix, error_or_None) for each module of the plan's read order
        (embeddings, layers 0 … N-1, the norm, the head), in that order, once it and every
        module before it are in place — the step of a forward pass run layer by layer; once, with
        the load's error, for the first module not in place when the load ends without it. On
        the load's callback thread, with the GIL."""
        self._core.on_modules(callback)

    def prioritize(self, prefix):
        """Moves the pending reads of module `prefix` (those named `prefix` or `prefix.…`) to the
        front of the load's queue: an engine asked for a module (an expert, a LoRA) has it first.
        Returns at once. A prefix no tensor is under raises loadstone.NotFoundError."""
        self._core.prioritize(prefix)

    def wait_tensor(self, name, timeout=None):
        """Tensor `name` once it is in place (interruptible, GIL released)."""
        box = []

        def step(s):
            t = self._core.wait_tensor(name, s)
            if t is not None:
                box.append(t)
            return bool(box)

        if not self._wait(step, timeout):
            raise TimeoutError(f"tensor {name!r} was not in place within {timeout} s")
        return box[0]

    def as_completed(self, timeout=None):
        """Yields each loadstone.Tensor as it lands (each once), then raises the load's error if it
        failed. `timeout`: seconds to wait for the next one (TimeoutError after)."""
        try:
            yield from self._landed(timeout)
        finally:
            self._close_bar()

    def _landed(self, timeout):
        while True:
            box = []

            def step(s):
                box[:] = [self._core.next_landed(s)]
                return box[0][0] != 1

            if not self._wait(step, timeout):
                raise TimeoutError(f"no tensor landed within {timeout} s")
            state, tensor = box[0]
            if state == 0:
                yield tensor
                continue
            error = self._core.error()
            if error is not None:
                raise error
            return

    # ---- the rest ------------------------------------------------------------------------------

    @property
    def progress(self):
        return Progress(**self._core.progress())

    @property
    def backend(self):
        return self._core.backend

    @property
    def read_stats(self):
        return self._core.read_stats()

    @property
    def plan(self):
        return self._plan

    def cancel(self):
        """Stops the load; its waits raise loadstone.CancelledError. Idempotent."""
        self._core.cancel()

    def write_trace(self, path):
        """Writes the Chrome trace of this load (Loader.load(..., trace=True))."""
        self._core.write_trace(os.fspath(path))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.done():
            self.cancel()
            self._core.wait()
        return False


def _shutdown():
    # Before the interpreter goes: every load still running is cancelled and waited for, so that
    # none of loadstone's threads wants the GIL once Python is finalizing.
    with _live_lock:
        handles = list(_live_handles)
    for h in handles:
        h._core.cancel()
    for h in handles:
        h._core.wait()


atexit.register(_shutdown)

_default = None
_default_lock = threading.Lock()


def default_loader():
    """The process's shared Loader (made on first use), which the drop-ins load through."""
    global _default
    from ._loader import Loader

    with _default_lock:
        if _default is None:
            _default = Loader()
        return _default


__all__ = ["LoadHandle", "Progress", "TensorFuture", "CancelledError", "default_loader"]
