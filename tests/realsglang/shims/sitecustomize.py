"""Test-only import hooks that let real SGLang 0.5.23 run on a CPU-only machine.

Loaded through PYTHONPATH by PEARL's real-SGLang test lane only; never in production.
- torchvision: PyPI's build cannot load its compiled ops against CPU torch and dies
  registering fake kernels for ``torchvision::nms``/``qnms``; defining those operator
  schemas (no kernels) just before torchvision is imported lets the import succeed.
- Mooncake prefill sender: its host-tensor path uses pinned memory and CUDA events;
  turning ``supports_host_tensor_indices`` off keeps it on the CPU path.
"""
import importlib.abc
import sys

_MOONCAKE_CONN = "sglang.srt.disaggregation.mooncake.conn"
_torchvision_prepared = False


def _prepare_torchvision():
    global _torchvision_prepared
    if _torchvision_prepared:
        return
    _torchvision_prepared = True
    import torch

    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in (
        "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
        "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    ):
        try:
            lib.define(schema)
        except RuntimeError:
            pass
    sys.modules.setdefault("_pearl_torchvision_fragment", lib)  # keep the library alive


def _patch_mooncake(module):
    sender = getattr(module, "MooncakeKVSender", None)
    if sender is not None:
        sender.supports_host_tensor_indices = False


class _Hooks(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision":
            _prepare_torchvision()
            return None
        if fullname != _MOONCAKE_CONN:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _patch_mooncake(module)


sys.meta_path.insert(0, _Hooks())
