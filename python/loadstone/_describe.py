"""describe(model): a live torch.nn.Module as the model description loadstone plans on
(docs/model-json.md) — classes, parameters and buffers in registration order with shapes,
dtypes and persistence, tied parameters, and the model's _no_split_modules and
_keep_in_fp32_modules. A model built on the meta device describes the same as a real one."""
import json


def _dtype(tensor):
    return str(tensor.dtype).replace("torch.", "")


def _tensor(name, tensor):
    return {"name": name, "shape": list(tensor.shape), "dtype": _dtype(tensor)}


def _module(name, module):
    node = {"name": name, "class": type(module).__name__}
    params = [_tensor(n, p) for n, p in module._parameters.items() if p is not None]
    children = [_module(n, m) for n, m in module._modules.items() if m is not None]
    buffers = []
    for n, b in module._buffers.items():
        if b is None:
            continue
        entry = _tensor(n, b)
        if n in module._non_persistent_buffers_set:
            entry["persistent"] = False
        buffers.append(entry)
    if params:
        node["params"] = params
    if children:
        node["children"] = children
    if buffers:
        node["buffers"] = buffers
    return node


def tied_parameters(model):
    """Groups of parameter names that are one tensor, each in registration order (the first is
    the one that is sized), as accelerate's find_tied_parameters finds them (by identity)."""
    groups = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def no_split_modules(model):
    """The model's own no-split classes: transformers' and diffusers' union over the models it
    holds (_get_no_split_modules), else its _no_split_modules; None when it declares none."""
    get = getattr(model, "_get_no_split_modules", None)
    if callable(get):
        try:
            return sorted(get("auto"))
        except (ValueError, TypeError, AttributeError):
            return None
    declared = getattr(model, "_no_split_modules", None)
    return list(declared) if declared is not None else None


def describe(model, *, no_split=None, keep_in_fp32=None, dtype=None):
    """The model description of `model` (a dict; json.dump it for `loadstone plan --model-json`).

    no_split: the classes never split (default: the model's _no_split_modules, when it declares
    them; otherwise the field is left out and the planner uses its default). keep_in_fp32:
    default the model's _keep_in_fp32_modules. dtype: the target dtype the sizes use (left out:
    each tensor's own)."""
    doc = {"modules": _module("", model)}
    doc["modules"].pop("name")
    ties = tied_parameters(model)
    if ties:
        doc["tied"] = ties
    if no_split is None:
        no_split = no_split_modules(model)
    if no_split is not None:
        doc["no_split"] = list(no_split)
    if keep_in_fp32 is None:
        keep_in_fp32 = getattr(model, "_keep_in_fp32_modules", None)
    if keep_in_fp32:
        doc["keep_in_fp32"] = list(keep_in_fp32)
    if dtype is not None:
        doc["dtype"] = str(dtype).replace("torch.", "")
    return doc


def describe_json(model, **options):
    """describe(model) as the JSON text `loadstone plan --model-json` reads."""
    return json.dumps(describe(model, **options), indent=1)
