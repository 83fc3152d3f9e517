"""Loads that run while Python goes on: futures per tensor, asyncio without blocking its loop,
as_completed, progress, cancel, errors as exceptions, several threads at once, and the GIL
released while a wait blocks."""
import asyncio
import concurrent.futures
import threading
import time

import pytest
import safetensors.torch
import torch

import loadstone
from loadstone._frameworks import to_torch


@pytest.fixture
def model(tmp_path):
    torch.manual_seed(0)
    tensors = {f"layers.{i}.weight": torch.randn(128, 96) for i in range(12)}
    tensors["embed"] = torch.randn(1000, 64).bfloat16()
    path = tmp_path / "model.safetensors"
    safetensors.torch.save_file(tensors, path)
    return path, tensors


def held(handle, name):
    """Holds the load open until the returned event is set: a done-callback on `name`'s future
    runs on the load's callback thread, and the load ends only once its callbacks have returned."""
    release = threading.Event()
    handle.tensor(name).add_done_callback(lambda f: release.wait(30))
    return release


def test_futures_resolve_to_each_tensor(model):
    path, tensors = model
    handle = loadstone.Loader().load(path)
    futures = {name: handle.tensor(name) for name in tensors}
    for name, future in futures.items():
        assert isinstance(future, concurrent.futures.Future)
        assert torch.equal(to_torch(future.result(timeout=30)), tensors[name])
    result = handle.result()
    assert list(result) == list(safetensors.safe_open(path, "pt").offset_keys())
    progress = handle.progress
    assert progress.tensors_done == progress.tensors_total == len(tensors)
    assert progress.bytes_placed == progress.bytes_to_place > 0
    with pytest.raises(loadstone.NotFoundError):
        handle.tensor("no.such.tensor")


def test_bytes_in_flight_reaches_the_reader_and_every_tensor_arrives(model):
    path, tensors = model
    handle = loadstone.Loader(bytes_in_flight=8 << 20).load(path)
    result = handle.result()
    assert "at most 8 MiB in flight" in handle.backend
    for name, tensor in tensors.items():
        assert torch.equal(to_torch(result[name]), tensor)
    assert "in flight" not in loadstone.Loader().load(path).backend


def test_a_module_future_resolves_once_its_tensors_are_in_place(model):
    path, tensors = model
    handle = loadstone.Loader().load(path)
    layer = handle.module("layers.1")  # layers.1.weight, not layers.10 or layers.11
    assert isinstance(layer, concurrent.futures.Future)
    assert layer.result(timeout=30) is None
    # In place by then: waiting for it takes no time.
    got = handle.wait_tensor("layers.1.weight", timeout=0)
    assert torch.equal(to_torch(got), tensors["layers.1.weight"])
    assert handle.module("").result(timeout=30) is None
    assert sorted(handle.result()) == sorted(tensors)
    with pytest.raises(loadstone.NotFoundError):
        handle.module("layers.99")
    with pytest.raises(loadstone.NotFoundError):
        handle.module("layer")


def test_modules_come_in_execution_order_and_a_module_can_go_first(model):
    path, tensors = model
    handle = loadstone.Loader().load(path)
    handle.prioritize("layers.11")  # read first; called back in order all the same
    seen = []
    handle.on_modules(lambda prefix, error: seen.append((prefix, error)))
    handle.result(timeout=30)
    # The embedding first (an input), then the layers by number (layers.2 before layers.10,
    # which the file stores first).
    assert seen == [("embed", None)] + [(f"layers.{i}", None) for i in range(12)]
    with pytest.raises(loadstone.NotFoundError):
        handle.prioritize("layers.99")
    # The order is a plan option: as stored (safetensors' order: layers.10 before layers.2), or
    # given.
    stored, given = [], []
    by_file = loadstone.Loader().load(path, order="file")
    by_file.on_modules(lambda prefix, error: stored.append(prefix))
    by_file.result(timeout=30)
    offsets = safetensors.safe_open(path, "pt").offset_keys()
    assert stored == [k.removesuffix(".weight") for k in offsets]
    assert stored.index("layers.10") < stored.index("layers.2")
    first = loadstone.Loader().load(path, order=["layers.5", "layers.3"])
    first.on_modules(lambda prefix, error: given.append(prefix))
    first.result(timeout=30)
    assert given[:3] == ["layers.5", "layers.3", "embed"]
    with pytest.raises(ValueError):
        loadstone.Loader().load(path, order="backwards")


def test_asyncio_awaits_without_blocking_its_loop(model):
    path, tensors = model

    async def main():
        handle = loadstone.Loader().load(path)
        release = held(handle, "embed")
        ticks = 0

        async def ticker():
            nonlocal ticks
            while ticks < 5:
                ticks += 1
                await asyncio.sleep(0.01)
            release.set()  # only the loop running this lets the load end

        task = asyncio.create_task(ticker())
        first = await handle.tensor("layers.0.weight")
        everything = await handle
        await task
        return first, everything, ticks

    first, everything, ticks = asyncio.run(main())
    assert ticks == 5
    assert torch.equal(to_torch(first), tensors["layers.0.weight"])
    assert sorted(everything) == sorted(tensors)


def test_as_completed_yields_each_tensor_once(model):
    path, tensors = model
    handle = loadstone.Loader().load(path)
    seen = [t.name for t in handle.as_completed()]
    assert sorted(seen) == sorted(tensors)
    assert list(handle.as_completed()) == []  # each once


def test_cancel_fails_every_wait_with_cancelled(model):
    path, tensors = model
    handle = loadstone.Loader().load(path)
    release = held(handle, "layers.0.weight")
    handle.cancel()
    release.set()
    with pytest.raises(loadstone.CancelledError) as caught:
        handle.result()
    assert isinstance(caught.value, concurrent.futures.CancelledError)
    with pytest.raises(loadstone.CancelledError):
        asyncio.run(_await(handle))
    # The Loader goes on working after a cancelled load.
    again = loadstone.default_loader().load(path).result()
    assert torch.equal(to_torch(again["embed"]), tensors["embed"])


async def _await(handle):
    return await handle


def test_the_gil_is_free_while_a_wait_blocks(model):
    path, _ = model
    handle = loadstone.Loader().load(path)
    release = held(handle, "embed")
    counted = []

    def count():  # Python code, which needs the GIL the waiting thread must not hold
        n = 0
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            n += 1
        counted.append(n)
        release.set()

    worker = threading.Thread(target=count)
    worker.start()
    assert handle.wait(timeout=30)
    worker.join()
    assert counted and counted[0] > 1000


def test_eight_threads_load_at_once(model):
    path, tensors = model
    shared = loadstone.Loader()

    def load(i):
        loader = shared if i % 2 else loadstone.Loader()
        got = loader.load(path, dtype="bfloat16" if i % 3 == 0 else None).result()
        return i, {n: to_torch(t) for n, t in got.items()}

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for i, got in pool.map(load, range(8)):
            for name, tensor in tensors.items():
                want = tensor.bfloat16() if i % 3 == 0 else tensor
                assert torch.equal(got[name], want), (i, name)


def test_errors_are_typed_with_the_runtime_message(tmp_path, model):
    path, _ = model
    with pytest.raises(loadstone.InvalidArgumentError) as caught:
        loadstone.Loader().load(path, dtype="int8")
    assert isinstance(caught.value, ValueError)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(path.read_bytes()[:-4096])
    with pytest.raises(loadstone.CorruptionError, match="broken.safetensors"):
        loadstone.Loader().load(broken)
    with pytest.raises(loadstone.InvalidArgumentError, match="backend"):
        loadstone.Loader(backend="floppy")


def test_a_file_that_changes_under_the_load_fails_it(tmp_path):
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file({"w": torch.randn(256, 256)}, path)
    ckpt = loadstone.Checkpoint.open(path)
    safetensors.torch.save_file({"w": torch.randn(256, 256)}, path)  # replaced after the header
    with pytest.raises(loadstone.Error, match="m.safetensors"):
        loadstone.Loader().load(ckpt).result()
