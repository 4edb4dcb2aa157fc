"""The upload ring's host-to-device copy as one CUDA driver call.

``Tensor.copy_`` of a pinned host tensor to the device goes through torch's dispatcher and, for
a block of torch's caching host allocator, records an event on it so the block is not reused
while the copy is in flight: host work on every decode step, which a small model's decode step
(bound by the scheduler's Python) pays in full. The upload ring's buffers need neither: they are
never freed, and the ring itself knows when a copy completed (the counter publication that
follows it, :mod:`.upload_buffers`). :class:`DriverCopy` enqueues ``cuMemcpyHtoDAsync_v2`` on
torch's current stream instead, through ``ctypes``.

Only ring slots go this way: a buffer of its own (the ring was full or closed) is a block of
torch's host allocator, which must see its copy to keep the block until the copy is done, so
it keeps ``Tensor.copy_``. Host only, never waits; not for use inside a graph capture (the ring
is closed until serving starts, so captures never reach it).
"""

from __future__ import annotations

import ctypes

import torch

_DRIVER_LIBRARY = "libcuda.so.1"


class DriverCopyError(RuntimeError):
    """The CUDA driver refused an upload copy, or could not be loaded."""


class DriverCopy:
    """``cuMemcpyHtoDAsync_v2`` on the current stream of one CUDA device.

    Args:
        device_index: the CUDA device whose current stream the copies go on (the upload's
            target device; its context is current on the scheduler's thread).
        library: the driver library to load (tests).
    Raises:
        DriverCopyError: the driver library or its copy function cannot be loaded.
    """

    def __init__(self, *, device_index: int, library: str = _DRIVER_LIBRARY) -> None:
        try:
            driver = ctypes.CDLL(library)
            copy = driver.cuMemcpyHtoDAsync_v2
            error_name = driver.cuGetErrorName
        except (OSError, AttributeError) as error:
            raise DriverCopyError(
                f"KV canary: cannot load cuMemcpyHtoDAsync_v2 from {library} ({error}); the "
                "upload copies need the CUDA driver that torch itself uses"
            ) from error
        # (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream) -> CUresult
        copy.argtypes = (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        copy.restype = ctypes.c_int
        error_name.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        error_name.restype = ctypes.c_int
        self._copy = copy
        self._error_name = error_name
        self._device_index = device_index
        self._current_stream = torch._C._cuda_getCurrentRawStream

    def __call__(self, *, host: torch.Tensor, device: torch.Tensor) -> None:
        """Enqueue the copy of ``host`` (pinned, contiguous) into ``device`` (contiguous, the
        same dtype and element count) on the current stream; never waits.

        Raises:
            ValueError: the two tensors differ in element count or dtype.
            DriverCopyError: the driver refused the copy (its error name in the message).
        """
        if host.shape[0] != device.shape[0] or host.dtype != device.dtype:
            raise ValueError(
                f"KV canary upload: cannot copy {tuple(host.shape)} {host.dtype} host words "
                f"into {tuple(device.shape)} {device.dtype} device words"
            )
        result = self._copy(
            device.data_ptr(), host.data_ptr(), host.nbytes,
            self._current_stream(self._device_index),
        )
        if result != 0:
            raise DriverCopyError(
                f"KV canary upload: cuMemcpyHtoDAsync_v2 of {host.nbytes} bytes failed: CUDA "
                f"driver error {result} ({self._name_of(result)})"
            )

    def _name_of(self, result: int) -> str:
        name = ctypes.c_char_p()
        if self._error_name(result, ctypes.byref(name)) != 0 or name.value is None:
            return "unknown"
        return name.value.decode()
