"""Make this CPU-only interpreter look like one with an sm90 GPU, for import checks only.

Put this directory first on PYTHONPATH of a child interpreter. It fakes what SGLang's launch
path inspects at import time (device capability, properties, sgl_kernel's compiled ``common_ops``
extension, fake-op registrations for ops that do not exist). Nothing here can run a kernel.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import types

import torch
import torch.library


class _Sm90Properties:
    major, minor = 9, 0
    name = "NVIDIA H200 (faked for import checks)"
    total_memory = 140 * 1024**3
    multi_processor_count = 132
    L2_cache_size = 60 * 1024**2
    gcnArchName = ""
    uuid = "fake-sm90"

    def __getattr__(self, name: str) -> int:
        return 0


torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_capability = lambda *args, **kwargs: (9, 0)
torch.cuda.get_device_name = lambda *args, **kwargs: _Sm90Properties.name
torch.cuda.get_device_properties = lambda *args, **kwargs: _Sm90Properties()


class _EmptyExtensionLoader(importlib.abc.Loader):
    """Loads sgl_kernel's compiled ``common_ops`` as an empty module."""

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return types.ModuleType(spec.name)

    def exec_module(self, module):  # noqa: ANN001, ANN201
        module.__file__ = "<fake common_ops>"


_real_spec_from_file_location = importlib.util.spec_from_file_location


def _spec_from_file_location(name, location=None, *args, **kwargs):  # noqa: ANN001, ANN202
    if name == "common_ops":
        return importlib.machinery.ModuleSpec(name, _EmptyExtensionLoader())
    return _real_spec_from_file_location(name, location, *args, **kwargs)


importlib.util.spec_from_file_location = _spec_from_file_location

_real_register_fake = torch.library.register_fake


def _register_fake_tolerant(op, func=None, /, *args, **kwargs):  # noqa: ANN001, ANN202
    def decorate(fn):  # noqa: ANN001, ANN202
        try:
            return _real_register_fake(op, fn, *args, **kwargs)
        except RuntimeError:  # the op does not exist without the compiled extension
            return fn

    return decorate if func is None else decorate(func)


torch.library.register_fake = _register_fake_tolerant
