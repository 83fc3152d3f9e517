"""accelerate's load_checkpoint_and_dispatch and infer_auto_device_map over loadstone.

The device map is loadstone's planner run on the live module (describe(model)): the same map
accelerate infers for the same module, budgets, dtype and no-split classes. The weights stream
in through loadstone; tensors mapped to "disk" are written to the offload folder in
accelerate's format (index.json and NAME.dat; plain safetensors tensors referenced in place,
as transformers does); then accelerate's own dispatch_model adds its hooks, as the original
does, so the model runs exactly as it would under accelerate.
"""
import json
import os
import warnings

import torch

from . import _core
from ._describe import describe
from ._errors import UnsupportedError
from ._frameworks import to_torch, torch_dtype
from ._loader import make_plan, open_checkpoint
from ._loads import default_loader

_MODES = ["auto", "balanced", "balanced_low_0", "sequential"]


def _accelerate():
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise UnsupportedError(
            "load_checkpoint_and_dispatch replaces accelerate's and uses its hooks: pip install "
            "accelerate") from None
    from accelerate import dispatch_model
    from accelerate.utils import find_tied_parameters, retie_parameters, set_module_tensor_to_device

    return dispatch_model, find_tied_parameters, retie_parameters, set_module_tensor_to_device


def _dtype_name(dtype):
    return None if dtype is None else str(dtype).replace("torch.", "")


def _max_memory(max_memory):
    if max_memory is None:
        return None
    out = {}
    for key, value in max_memory.items():
        if isinstance(key, torch.device):
            key = key.index if key.type == "cuda" else key.type
        out[key] = value
    return out


def _classes(no_split_module_classes):
    """accelerate's no_split_module_classes: None is none, one name is a list of one."""
    if isinstance(no_split_module_classes, str):
        return [no_split_module_classes]
    return list(no_split_module_classes or [])


def _plan_map(model, mode, max_memory, no_split_module_classes, dtype, special_dtypes=None,
              offload_buffers=False, fallback_allocation=False, clean_result=True):
    doc = describe(model, no_split=_classes(no_split_module_classes), keep_in_fp32=[])
    planned = _core.infer_device_map(
        json.dumps(doc), device_map=mode, max_memory=_max_memory(max_memory),
        dtype=_dtype_name(dtype), offload_buffers=offload_buffers,
        fallback_allocation=fallback_allocation, clean_result=clean_result,
        special_dtypes={k: _dtype_name(v) for k, v in (special_dtypes or {}).items()} or None)
    for w in planned["warnings"]:
        warnings.warn(w, stacklevel=3)
    return planned["device_map"]


def infer_auto_device_map(model, max_memory=None, no_split_module_classes=None, dtype=None,
                          special_dtypes=None, verbose=False, clean_result=True,
                          offload_buffers=False, fallback_allocation=False):
    """accelerate.infer_auto_device_map: the same map (keys, order, devices), planned by loadstone
    on the module's tree. verbose: loadstone's explanation printed."""
    if verbose:
        doc = describe(model, no_split=_classes(no_split_module_classes), keep_in_fp32=[])
        planned = _core.infer_device_map(
            json.dumps(doc), device_map="sequential", max_memory=_max_memory(max_memory),
            dtype=_dtype_name(dtype), explain=True)
        print("\n".join(planned["explanation"]))
    return _plan_map(model, "sequential", max_memory, no_split_module_classes, dtype,
                     special_dtypes, offload_buffers, fallback_allocation, clean_result)


def _device_of(name, device_map):
    module = name
    while module and module not in device_map:
        module = module.rpartition(".")[0]
    if module == "" and "" not in device_map:
        raise ValueError(f"{name} doesn't have any device set.")
    return device_map[module]


def _map_text(device):
    if isinstance(device, torch.device):
        return str(device) if device.type != "cuda" or device.index is not None else "cuda:0"
    return device


def load_checkpoint_in_model(model, checkpoint, device_map=None, offload_folder=None, dtype=None,
                             offload_state_dict=False, offload_buffers=False, strict=False,
                             progress=None, offload_in_place=False):
    """accelerate's load_checkpoint_in_model through loadstone (see load_checkpoint_and_dispatch).

    offload_state_dict: accelerate writes the CPU weights to a temporary folder and reads them
    back, which leaves each in the checkpoint's dtype (or `dtype`) rather than its parameter's;
    loadstone gives that result without the round trip."""
    (_, find_tied_parameters, retie_parameters,
     set_module_tensor_to_device) = _accelerate()
    from .torch import load_into

    if device_map is None:
        load_into(model, checkpoint, strict=strict, progress=progress)
        return
    tied = find_tied_parameters(model)
    if offload_folder is None and "disk" in device_map.values():
        raise ValueError("At least one of the model submodule will be offloaded to disk, please "
                         "pass along an `offload_folder`.")
    dtype = getattr(torch, dtype.replace("torch.", "")) if isinstance(dtype, str) else dtype
    state = model.state_dict(keep_vars=True)
    buffers = {name for name, _ in model.named_buffers()}
    ckpt = open_checkpoint(os.fspath(checkpoint))
    unexpected = [n for n in ckpt.keys() if n not in state and "SCB" not in n]
    if strict and unexpected:
        raise RuntimeError(f"Error(s) in loading state_dict for {model.__class__.__name__}:\n\t"
                           "Unexpected key(s) in state_dict: "
                           + ", ".join(f'"{k}"' for k in unexpected) + ". ")
    include, special, explicit = [], {}, {}
    targets = {}  # name -> (device, dtype it takes in the model)
    for info in ckpt.infos():
        name = info["name"]
        if name not in state or "SCB" in name:
            continue
        device = _map_text(_device_of(name, device_map))
        floating = info["dtype"].startswith(("float", "bfloat"))
        new_dtype = dtype if dtype is not None and floating else None
        if device == "disk":
            if not offload_buffers and name in buffers:
                continue  # accelerate leaves such a buffer as it is
            targets[name] = ("disk", new_dtype or torch_dtype(info["dtype"]))
        else:
            kept = device == "cpu" and offload_state_dict and not _integer(state[name])
            if kept and new_dtype is None:
                new_dtype = torch_dtype(info["dtype"])  # what accelerate's round trip leaves
            wants = new_dtype or state[name].dtype
            if floating and _dtype_name(wants) in ("float32", "float16", "bfloat16"):
                if _dtype_name(wants) != info["dtype"]:
                    special[name] = _dtype_name(wants)
            targets[name] = (device, new_dtype)
        include.append(name)
        explicit[name] = device
    plan = make_plan(ckpt, explicit_map=explicit, include=include, special_dtypes=special or None,
                     offload_folder=os.fspath(offload_folder) if offload_folder else None,
                     offload_buffers=offload_buffers, offload_in_place=offload_in_place)
    loader = default_loader()
    handle = loader.start(plan, ckpt.keys(), progress=progress, desc="loading checkpoint")
    if plan.offloaded:
        os.makedirs(offload_folder, exist_ok=True)
        loader.write_offload(plan)
    loaded = handle.result()
    with torch.no_grad():
        for name, (device, new_dtype) in targets.items():
            if device == "disk":
                set_module_tensor_to_device(model, name, "meta", dtype=new_dtype)
            else:
                set_module_tensor_to_device(model, name, device, value=to_torch(loaded[name]),
                                            dtype=new_dtype, clear_cache=False)
    retie_parameters(model, tied)


def _integer(tensor):
    return str(tensor.dtype).startswith(("torch.uint", "torch.int", "torch.bool"))


def load_checkpoint_and_dispatch(model, checkpoint, device_map=None, max_memory=None,
                                 no_split_module_classes=None, offload_folder=None,
                                 offload_buffers=False, dtype=None, offload_state_dict=None,
                                 skip_keys=None, preload_module_classes=None, force_hooks=False,
                                 strict=False, full_state_dict=True, broadcast_from_rank0=False,
                                 *, offload_in_place=False, progress=None):
    """accelerate.load_checkpoint_and_dispatch: the same arguments, map, hooks and result
    (model.hf_device_map is set), the weights read by loadstone.

    offload_state_dict (default: on when the map has "disk", as accelerate's): accelerate bounds
    host memory by writing the CPU weights to a temporary folder and reading them back, which
    leaves each in the checkpoint's dtype (or `dtype`) rather than its parameter's; loadstone
    streams every tensor into place through a bounded staging pool and gives the same dtypes
    without the round trip. broadcast_from_rank0 and full_state_dict=False (distributed state
    dicts) are not supported yet.

    Extra: offload_in_place=True references plain safetensors tensors mapped to "disk" where
    they are (index entries with safetensors_file and weight_name, which accelerate's hooks read;
    transformers' convention) instead of copying them into NAME.dat files: nothing is written,
    but the offload folder then needs the checkpoint to stay where it is."""
    dispatch_model = _accelerate()[0]
    if broadcast_from_rank0:
        raise UnsupportedError("broadcast_from_rank0: rank-aware loading is not in loadstone yet")
    if not full_state_dict:
        raise UnsupportedError("full_state_dict=False: loadstone loads full state dicts only")
    if isinstance(device_map, str) and device_map not in _MODES:
        raise ValueError("If passing a string for `device_map`, please choose 'auto', 'balanced', "
                         "'balanced_low_0' or 'sequential'.")
    if isinstance(device_map, str):
        device_map = _plan_map(model, device_map, max_memory, no_split_module_classes, dtype,
                               offload_buffers=offload_buffers)
    if offload_state_dict is None and device_map is not None and "disk" in device_map.values():
        offload_state_dict = True
    load_checkpoint_in_model(model, checkpoint, device_map=device_map,
                             offload_folder=offload_folder, dtype=dtype,
                             offload_state_dict=bool(offload_state_dict),
                             offload_buffers=offload_buffers, strict=strict, progress=progress,
                             offload_in_place=offload_in_place)
    if device_map is None:
        return model
    return dispatch_model(model, device_map=device_map, offload_dir=offload_folder,
                          offload_buffers=offload_buffers, skip_keys=skip_keys,
                          preload_module_classes=preload_module_classes, force_hooks=force_hooks)
