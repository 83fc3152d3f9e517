"""loadstone.Tensor as the Python array API's DLPack producer: torch and numpy take it without a
copy, the capsule carries what the DLPack ABI says (read here with ctypes, not through a
consumer), and the memory lives until the last consumer lets go."""
import ctypes
import gc
import sys

import numpy as np
import pytest
import safetensors.torch
import torch

import loadstone
from loadstone._frameworks import to_torch


@pytest.fixture
def loaded(tmp_path):
    tensors = {
        "f32": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
        "i64": torch.arange(5, dtype=torch.int64),
        "bf16": torch.randn(8, 16).bfloat16(),
        "e4m3": torch.randn(4, 4).to(torch.float8_e4m3fn),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
    }
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file(tensors, path)
    result = loadstone.Loader().load(path).result()
    return tensors, result


# ---- the capsule, as the ABI lays it out ---------------------------------------------------------

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_api = ctypes.pythonapi
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def read_capsule(capsule):
    name = _api.PyCapsule_GetName(capsule)
    pointer = _api.PyCapsule_GetPointer(capsule, name)
    if name == b"dltensor_versioned":
        managed = DLManagedTensorVersioned.from_address(pointer)
        return name, (managed.major, managed.minor), managed.flags, managed.dl_tensor
    return name, None, None, DLManagedTensor.from_address(pointer).dl_tensor


def test_versioned_and_legacy_capsules_describe_the_tensor(loaded):
    _, got = loaded
    t = got["f32"]
    for kwargs, name, version in [({}, b"dltensor", None),
                                  ({"max_version": (1, 0)}, b"dltensor_versioned", (1, 0)),
                                  ({"max_version": (1, 3)}, b"dltensor_versioned", (1, 1))]:
        capsule = t.__dlpack__(**kwargs)
        got_name, got_version, flags, dl = read_capsule(capsule)
        assert (got_name, got_version) == (name, version)
        assert (dl.device.device_type, dl.device.device_id) == (1, 0)  # kDLCPU
        assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (2, 32, 1)  # kDLFloat
        assert [dl.shape[i] for i in range(dl.ndim)] == [2, 3, 4]
        assert [dl.strides[i] for i in range(dl.ndim)] == [12, 4, 1]
        assert dl.data + dl.byte_offset == t.data_ptr
        assert flags in (None, 0)
    assert t.__dlpack_device__() == (1, 0)


def test_float8_has_a_code_from_dlpack_1_1_only(loaded):
    _, got = loaded
    t = got["e4m3"]
    with pytest.raises(BufferError, match="as_bytes"):
        t.__dlpack__(max_version=(1, 0))
    with pytest.raises(BufferError):
        t.__dlpack__()
    _, version, _, dl = read_capsule(t.__dlpack__(max_version=(1, 1)))
    assert version == (1, 1)
    assert (dl.dtype.code, dl.dtype.bits) == (10, 8)  # kDLFloat8_e4m3fn
    assert read_capsule(got["bf16"].__dlpack__())[3].dtype.code == 4  # kDLBfloat
    assert read_capsule(got["bool"].__dlpack__())[3].dtype.code == 6  # kDLBool


def test_torch_takes_every_dtype_without_a_copy(loaded):
    expected, got = loaded
    for name, reference in expected.items():
        tensor = to_torch(got[name])
        assert tensor.dtype == reference.dtype and tensor.shape == reference.shape, name
        assert tensor.data_ptr() == got[name].data_ptr, name
        assert torch.equal(tensor.reshape(-1).view(torch.uint8),
                           reference.reshape(-1).view(torch.uint8)), name
    direct = torch.from_dlpack(got["bf16"])  # bf16 has a DLPack code: no byte view needed
    assert direct.dtype == torch.bfloat16 and direct.data_ptr() == got["bf16"].data_ptr


def test_numpy_takes_what_it_can_hold(loaded):
    expected, got = loaded
    array = np.from_dlpack(got["f32"])
    assert array.ctypes.data == got["f32"].data_ptr
    np.testing.assert_array_equal(array, expected["f32"].numpy())
    np.testing.assert_array_equal(np.from_dlpack(got["i64"]), expected["i64"].numpy())
    with pytest.raises((BufferError, TypeError, RuntimeError)):
        np.from_dlpack(got["bf16"])  # numpy has no bfloat16
    raw = np.from_dlpack(got["bf16"].as_bytes())
    assert raw.shape == (8, 32) and raw.ctypes.data == got["bf16"].data_ptr


def test_copy_and_device_requests(loaded):
    expected, got = loaded
    t = got["f32"]
    capsule = t.__dlpack__(max_version=(1, 0), copy=True)
    _, _, flags, dl = read_capsule(capsule)
    assert flags & 2  # IS_COPIED
    assert dl.data != t.data_ptr
    copied = torch.from_dlpack(_Capsule(capsule))
    assert torch.equal(copied, expected["f32"]) and copied.data_ptr() != t.data_ptr
    assert t.__dlpack__(dl_device=(1, 0)) is not None
    with pytest.raises(BufferError, match="cpu"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=7)  # a CPU tensor takes no stream
    assert t.__dlpack__(stream=-1) is not None


class _Capsule:
    """Hands a capsule made already to torch.from_dlpack."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_the_buffer_outlives_the_loader_the_handle_and_the_tensor_object(tmp_path):
    reference = torch.randn(1024, 257)
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file({"w": reference}, path)
    loader = loadstone.Loader()
    handle = loader.load(path)
    tensor = to_torch(handle.tensor("w").result())
    del handle, loader
    gc.collect()
    assert torch.equal(tensor, reference)
    # A capsule no consumer took frees what it holds (the refcount of the capsule is all).
    t = loadstone.Loader().load(path).result()["w"]
    capsule = t.__dlpack__()
    assert sys.getrefcount(capsule) == 2
    del capsule
    assert torch.equal(to_torch(t), reference)


def test_as_bytes_views_the_same_memory(loaded):
    _, got = loaded
    b = got["f32"].as_bytes()
    assert b.dtype == "uint8" and b.shape == (2, 3, 16) and b.data_ptr == got["f32"].data_ptr
    assert got["scalar"].as_bytes().shape == (4,)
    assert bytes(np.from_dlpack(got["i64"].as_bytes()).reshape(-1)) == got["i64"].tobytes()
