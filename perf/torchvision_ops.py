"""torchvision's C++ operators, for a torchvision whose C++ library cannot load beside this torch.

The torchvision 0.28.0 wheel that pip finds on this kind of machine is PyPI's, built for CUDA
torch: its `_C.so` needs `libtorch_cuda.so`, which the torch 2.13.0+cpu wheel has not, so the
library does not load, and `import torchvision` then stops in its own fake-kernel registrations
("operator torchvision::nms does not exist"). Users of a CPU torch install the matching +cpu
torchvision, which is not on this disk. `ensure()` (the model zoo and the tests call it before
importing torchvision) defines what torchvision's models need in that case:

- `torchvision::nms`: the greedy non-maximum suppression of torchvision's CPU kernel (boxes in
  descending score order, stable; a box is dropped when its IoU with a kept one is above the
  threshold), computed with torch ops, registered for the CPU and Meta keys;
- `torchvision::qnms`: the schema only (torchvision registers a fake kernel for it at import).

roi_align needs nothing: torchvision uses its own Python version when its C++ ops are absent.
Where torchvision's library loads, `ensure()` changes nothing.
"""
import importlib.util
import os

import torch

_state = {"done": False, "stand_in": False}
_lib = None


def _library_loads():
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # no torchvision: nothing to stand in for (its import fails as usual)
    for d in spec.submodule_search_locations:
        for name in os.listdir(d):
            if name.startswith("_C.") and name.endswith(".so"):
                try:
                    torch.ops.load_library(os.path.join(d, name))
                    return True
                except (OSError, RuntimeError):
                    return False
    return False


def _nms(dets, scores, iou_threshold):
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    order = torch.sort(scores, stable=True, descending=True)[1]
    d = dets[order]
    x1, y1, x2, y2 = d.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    w = (torch.minimum(x2[:, None], x2[None, :]) - torch.maximum(x1[:, None], x1[None, :])).clamp(min=0)
    h = (torch.minimum(y2[:, None], y2[None, :]) - torch.maximum(y1[:, None], y1[None, :])).clamp(min=0)
    inter = w * h
    over = (inter / (areas[:, None] + areas[None, :] - inter) > iou_threshold).numpy()
    n = over.shape[0]
    dropped = [False] * n
    keep = []
    for i in range(n):
        if dropped[i]:
            continue
        keep.append(i)
        row = over[i]
        for j in range(i + 1, n):
            if row[j]:
                dropped[j] = True
    return order[torch.tensor(keep, dtype=torch.long)]


def ensure():
    """Makes `import torchvision` work with its detection operators; returns True when the
    Python stand-ins were installed (torchvision's library did not load)."""
    global _lib
    if _state["done"]:
        return _state["stand_in"]
    _state["done"] = True
    if _library_loads():
        return False
    _lib = torch.library.Library("torchvision", "DEF")
    _lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _lib.impl("nms", _nms, "CPU")
    import torchvision.ops.boxes as boxes  # imports torchvision, which now finds its ops defined

    boxes._assert_has_ops = lambda: None  # nms: the op above; the rest keeps torchvision's check
    _state["stand_in"] = True
    return True
