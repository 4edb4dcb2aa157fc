"""The upload ring's driver copy: ``cuMemcpyHtoDAsync_v2`` on torch's current stream, refusing
mismatched tensors and naming the driver's error; loaded loudly or not at all."""

import sys

import pytest
import torch

from sglang.srt.kv_canary.runner.driver_copy import DriverCopy, DriverCopyError
from sglang.srt.kv_canary.runner.upload_buffers import UploadBufferRing
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")
register_cuda_ci(est_time=2, suite="kv-canary-gpu")

_CUDA_ERROR_INVALID_VALUE = 1


def _driver_copy_with(copy, error_name=None) -> DriverCopy:
    """A DriverCopy whose driver functions are ``copy`` and ``error_name`` (no CUDA here)."""
    driver_copy = DriverCopy.__new__(DriverCopy)
    driver_copy._copy = copy
    driver_copy._error_name = error_name
    driver_copy._device_index = 0
    driver_copy._current_stream = lambda index: 1234
    return driver_copy


def test_a_driver_library_that_cannot_be_loaded_is_named() -> None:
    with pytest.raises(DriverCopyError, match="libkv-canary-no-such-driver.so"):
        DriverCopy(device_index=0, library="libkv-canary-no-such-driver.so")


def test_the_copy_goes_on_the_current_stream_with_the_tensors_addresses_and_bytes() -> None:
    calls = []
    driver_copy = _driver_copy_with(lambda *args: calls.append(args) or 0)
    host, device = torch.arange(5, dtype=torch.int64), torch.zeros(5, dtype=torch.int64)
    driver_copy(host=host, device=device)
    assert calls == [(device.data_ptr(), host.data_ptr(), 40, 1234)]


@pytest.mark.parametrize("device", [torch.zeros(4, dtype=torch.int64),
                                    torch.zeros(5, dtype=torch.int32)])
def test_tensors_of_other_sizes_or_dtypes_are_refused_before_the_driver(device) -> None:
    driver_copy = _driver_copy_with(lambda *args: pytest.fail("the driver was called"))
    with pytest.raises(ValueError, match=r"cannot copy \(5,\) torch.int64 host words"):
        driver_copy(host=torch.zeros(5, dtype=torch.int64), device=device)


def test_a_refused_copy_raises_with_the_drivers_error_name() -> None:
    def error_name(code, name_pointer) -> int:
        name_pointer._obj.value = b"CUDA_ERROR_INVALID_VALUE"
        return 0

    driver_copy = _driver_copy_with(lambda *args: _CUDA_ERROR_INVALID_VALUE, error_name)
    with pytest.raises(DriverCopyError, match=r"driver error 1 \(CUDA_ERROR_INVALID_VALUE\)"):
        driver_copy(host=torch.zeros(2, dtype=torch.int64), device=torch.zeros(2, dtype=torch.int64))


def test_ring_slots_use_the_slot_copy_and_buffers_of_their_own_use_torch() -> None:
    """A buffer of its own is a block of torch's host allocator: torch must see its copy."""
    copied = []

    def slot_copy(*, host: torch.Tensor, device: torch.Tensor) -> None:
        copied.append(host.data_ptr())
        device.copy_(host)

    ring = UploadBufferRing(slots=1, words=8, pin_memory=False, slot_copy=slot_copy)
    own = ring.take(3)  # the ring is not open yet
    own.array[:] = [1, 2, 3]
    target = torch.zeros(3, dtype=torch.int64)
    ring.copy(own, to=target, mark=1)
    assert copied == [] and target.tolist() == [1, 2, 3]
    ring.open(landed=lambda: 0)
    slot = ring.take(3)
    slot.array[:] = [4, 5, 6]
    ring.copy(slot, to=target, mark=1)
    assert copied == [slot.tensor.data_ptr()] and target.tolist() == [4, 5, 6]


@pytest.mark.gpu
def test_the_driver_copy_lands_the_words_in_stream_order_on_a_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    driver_copy = DriverCopy(device_index=torch.cuda.current_device())
    host = torch.arange(4096, dtype=torch.int64).pin_memory()
    device = torch.zeros(4096, dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(2_000_000)  # the copy queues behind this on `stream`
        driver_copy(host=host, device=device)
        doubled = device * 2  # stream order: after the copy
    stream.synchronize()
    assert torch.equal(device.cpu(), host) and torch.equal(doubled.cpu(), host * 2)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
