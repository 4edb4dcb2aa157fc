"""DirectLauncher: the compiled variant of each launch key, launched without
``JITFunction.run``'s per-call binding (``jit_kernel/kv_canary/direct_launch.py``).

CPU: the contract (annotated parameters refused, naming them; trailing parameters by name, a
missing or unknown name refused) and the type classes of scalar arguments. CUDA: direct
launches write exactly what the normal launch writes over changing sizes, offsets, strides and
dtypes, for a kernel that specializes on nothing and for one that specializes on alignment and
values (one kept variant per launch key, exactly as many as Triton compiled); the key cap; and a
launch hook (a profiler's) sends every launch through the normal path; a launcher with a bound
tail (``with_tail``) writes what the normal launch writes, keyed on its leading arguments.
"""

import gc
import sys

import pytest
import torch
import triton
import triton.language as tl

from sglang.jit_kernel.kv_canary import direct_launch
from sglang.jit_kernel.kv_canary.direct_launch import (
    DirectLauncher,
    _int_type,
    ceil_div,
    direct_launches_supported,
)
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")
register_cuda_ci(est_time=10, suite="kv-canary-gpu")


@triton.jit(do_not_specialize=["src_ptr", "dst_ptr", "n", "stride", "offset"])
def _affine_kernel(src_ptr, dst_ptr, n, stride, offset, SCALE: tl.constexpr,
                   BLOCK: tl.constexpr):
    index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = index < n
    value = tl.load(src_ptr + index * stride, mask=valid, other=0)
    tl.store(dst_ptr + index, value * SCALE + offset, mask=valid)


@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["src_ptr"])
def _specializing_kernel(src_ptr, dst_ptr, n, stride, offset, SCALE: tl.constexpr,
                         BLOCK: tl.constexpr):
    """Like _affine_kernel, but Triton specializes dst_ptr on its alignment and stride / offset
    on their values (divisible by 16, or 1)."""
    index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = index < n
    value = tl.load(src_ptr + index * stride, mask=valid, other=0)
    tl.store(dst_ptr + index, value * SCALE + offset, mask=valid)


@triton.jit
def _annotated_kernel(dst_ptr, n: tl.int32, BLOCK: tl.constexpr):
    index = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + index, index, mask=index < n)


@pytest.mark.skipif(
    not direct_launches_supported() or DirectLauncher._interpreted(_annotated_kernel),
    reason="needs Triton 3.6, not interpreted (every launch is a normal call)",
)
def test_a_kernel_with_annotated_parameters_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['n'\] carry type annotations"):
        DirectLauncher(_annotated_kernel, num_warps=1)
    DirectLauncher(_affine_kernel, num_warps=1)
    DirectLauncher(_specializing_kernel, num_warps=1)


def test_trailing_parameters_go_by_name() -> None:
    launcher = DirectLauncher(_affine_kernel, num_warps=1)
    args = ("src", "dst", 8, 1, 0)
    assert launcher._with_named(args, {"BLOCK": 128, "SCALE": 2}) == (*args, 2, 128)
    with pytest.raises(TypeError, match=r"missing \['BLOCK'\], not expected \['SIZE'\]"):
        launcher._with_named(args, {"SCALE": 2, "SIZE": 128})
    with pytest.raises(TypeError, match=r"missing \['offset'\]"):
        launcher._with_named(args[:4], {"SCALE": 2, "BLOCK": 128})


def test_a_bound_tail_takes_the_leading_arguments_only() -> None:
    launcher = DirectLauncher(_affine_kernel, num_warps=1)
    bound = launcher.with_tail((0, 2, 128))  # offset, SCALE, BLOCK
    with pytest.raises(TypeError, match="with a bound tail takes 4 leading arguments, got 5"):
        bound((1,), "src", "dst", 8, 1, 0)
    with pytest.raises(ValueError, match="takes 7 arguments; a tail of 8 does not fit"):
        launcher.with_tail((0,) * 8)
    with pytest.raises(TypeError, match="_affine_kernel takes 7 arguments, got 6"):
        launcher((1,), "src", "dst", 8, 1, 0, 2)
    # the launcher counts a tail's variants while the tail lives, and does not keep it (a tail
    # holds a device state's tensors)
    assert list(launcher._tails) == [bound]
    del bound
    gc.collect()
    assert list(launcher._tails) == []


def test_grid_sizes_divide_as_triton_does() -> None:
    for numerator in (0, 1, 2, 127, 128, 129, 8192, 2**40 + 3):
        for denominator in (1, 2, 64, 128, 2048):
            assert ceil_div(numerator, denominator) == triton.cdiv(numerator, denominator)


@pytest.mark.parametrize("module_name", [
    "accepted_owner", "admission_owner", "append_history", "canary_forward", "hash_oracle",
    "scatter_req_token_ids", "sweep",
])
def test_every_launch_sizes_its_grid_with_the_host_helper(module_name: str) -> None:
    """A launch module's ``ceil_div`` is the host helper, not a jitted function of the same
    kind (Triton's interpreter calls jitted functions from the host, so only a GPU would notice)."""
    import importlib

    module = importlib.import_module(f"sglang.jit_kernel.kv_canary.{module_name}")
    assert module.ceil_div is ceil_div


def test_scalar_type_classes_follow_tritons_rule() -> None:
    assert [_int_type(v) for v in (0, -1, 2**31 - 1, -(2**31))] == ["i32"] * 4
    assert [_int_type(v) for v in (2**31, -(2**31) - 1, 2**63 - 1)] == ["i64"] * 3
    assert _int_type(2**63) == "u64"
    assert _int_type(True) == "u1"


def test_another_triton_launches_through_the_normal_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert direct_launches_supported() == triton.__version__.startswith("3.6.")
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert not direct_launches_supported()
    assert not DirectLauncher(_affine_kernel, num_warps=1)._direct


def _reference(src: torch.Tensor, *, n: int, stride: int, offset: int, scale: int) -> list[int]:
    return [int(src[i * stride]) * scale + offset for i in range(n)]


@pytest.mark.gpu
def test_direct_launches_write_what_the_normal_launch_writes() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    assert direct_launches_supported(), f"triton {triton.__version__}"
    launcher = DirectLauncher(_affine_kernel, num_warps=4)
    buffer = torch.arange(4096, dtype=torch.int64, device="cuda") * 3 - 7
    cases = [  # (view start, n, stride, offset, scale, dtype): odd offsets, 1s, big values
        (0, 5, 1, 0, 2, torch.int64), (1, 300, 1, 1, 2, torch.int64),
        (3, 1, 7, -5, 2, torch.int64), (5, 1000, 3, 2**40, 2, torch.int64),
        (2, 17, 2, 16, 3, torch.int64), (0, 64, 1, 0, 2, torch.int32),
        (7, 33, 5, -1, 2, torch.int32),
    ]
    for start, n, stride, offset, scale, dtype in cases:
        src = buffer.to(dtype)[start:]
        dst = torch.full((n,), -99, dtype=dtype, device="cuda")
        launcher((triton.cdiv(n, 128),), src, dst, n, stride, offset, scale, 128)
        torch.cuda.synchronize()
        assert dst.tolist() == _reference(src, n=n, stride=stride, offset=offset, scale=scale)
    # int64 / int32 tensors x i32 / i64 offsets x two SCALEs: one variant per type signature
    assert launcher.variants == 4


def _compiled_variants(kernel) -> int:
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


@pytest.mark.gpu
def test_a_specializing_kernel_gets_one_variant_per_launch_key() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    launcher = DirectLauncher(_specializing_kernel, num_warps=4)
    buffer = torch.arange(4096, dtype=torch.int64, device="cuda") * 3 - 7
    out = torch.full((4096,), -99, dtype=torch.int64, device="cuda")
    # (dst start: 0 / 1 word, 16-byte aligned or not; n; stride and offset: 1, a multiple of
    # 16 or neither): eight distinct specializations
    cases = [
        (0, 5, 1, 5), (1, 300, 1, 5), (0, 17, 16, 5), (1, 33, 3, 16), (0, 64, 3, 1),
        (1, 9, 16, 16), (0, 100, 1, 1), (1, 1, 3, 5),
    ]
    for _ in range(2):  # the second pass launches every key directly
        for start, n, stride, offset in cases:
            out.fill_(-99)
            dst = out[start:]
            launcher((triton.cdiv(n, 128),), buffer, dst, n, stride, offset, SCALE=2, BLOCK=128)
            torch.cuda.synchronize()
            expected = _reference(buffer, n=n, stride=stride, offset=offset, scale=2)
            assert dst[:n].tolist() == expected, (start, n, stride, offset)
            assert dst[n:n + 4].tolist() == [-99] * min(4, dst.shape[0] - n)
    # every launch key kept once; Triton compiled one variant per distinct specialization, and
    # the launcher's keys are exactly Triton's (neither finer nor coarser)
    assert launcher.variants == len(cases) == _compiled_variants(_specializing_kernel)


@pytest.mark.gpu
def test_a_bound_tail_launches_what_the_normal_launch_writes() -> None:
    """The tail (offset, SCALE, BLOCK) is bound once per launcher; the head's specializations
    (dst alignment, stride) are keyed: one kept variant per head key and tail. (BLOCK 64: no
    other test compiles these variants, so Triton's new ones are this test's.)"""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    launcher = DirectLauncher(_specializing_kernel, num_warps=4)
    compiled_before = _compiled_variants(_specializing_kernel)
    buffer = torch.arange(4096, dtype=torch.int64, device="cuda") * 3 - 7
    out = torch.full((4096,), -99, dtype=torch.int64, device="cuda")
    tails = {offset: launcher.with_tail((offset, 2, 64)) for offset in (5, 16)}
    cases = [(0, 5, 1), (1, 300, 1), (0, 17, 16), (1, 33, 3)]  # dst start, n, stride
    for _ in range(2):  # the second pass launches every key directly
        for offset, bound in tails.items():
            for start, n, stride in cases:
                out.fill_(-99)
                dst = out[start:]
                bound((triton.cdiv(n, 64),), buffer, dst, n, stride)
                torch.cuda.synchronize()
                assert dst[:n].tolist() == _reference(buffer, n=n, stride=stride, offset=offset,
                                                      scale=2), (offset, start, n, stride)
                assert dst[n:n + 4].tolist() == [-99] * min(4, dst.shape[0] - n)
    assert launcher.variants == len(tails) * len(cases) == (
        _compiled_variants(_specializing_kernel) - compiled_before)


@pytest.mark.gpu
def test_launch_keys_beyond_the_cap_launch_through_the_normal_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setattr(direct_launch, "MAX_VARIANTS", 1)
    launcher = DirectLauncher(_specializing_kernel, num_warps=4)
    src = torch.arange(64, dtype=torch.int64, device="cuda")
    for offset in (5, 16, 16, 5):
        dst = torch.zeros(8, dtype=torch.int64, device="cuda")
        launcher((1,), src, dst, 8, 1, offset, 1, 128)
        torch.cuda.synchronize()
        assert dst.tolist() == [value + offset for value in range(8)]
    assert launcher.variants == 1


@pytest.mark.gpu
def test_a_launch_hook_sees_every_launch() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    launcher = DirectLauncher(_affine_kernel, num_warps=4)
    src = torch.arange(8, dtype=torch.int64, device="cuda")
    dst = torch.zeros(8, dtype=torch.int64, device="cuda")
    launcher((1,), src, dst, 8, 1, 0, 1, 128)  # compiles
    seen = []

    def hook(metadata) -> None:
        seen.append(metadata)

    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        launcher((1,), src, dst, 8, 1, 1, 1, 128)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    torch.cuda.synchronize()
    assert len(seen) == 1
    assert dst.tolist() == list(range(1, 9))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
