"""The Triton device-function forms of the hashing (mix64, chain_term, slot fingerprints over
several real-data sources) equal the scalar references bit for bit, and the kernels run in
Triton's interpreter even when triton was imported before the interpreter was chosen."""

import os
import subprocess
import sys

import pytest
import torch

from _canary_sim import TRITON_DEVICES, import_triton_modules
from sglang.jit_kernel.kv_canary.hashing import (
    chain_term_scalar,
    lane_mask_scalar,
    mix64_scalar,
    slot_fingerprint_scalar,
    to_signed_i64,
)
from sglang.jit_kernel.kv_canary.launch_config import real_data_args, real_data_constexprs
from sglang.jit_kernel.kv_canary.kernel_inputs import RealDataSources
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci
from test_canary_hashing import random_values, signed

register_cpu_ci(est_time=20, suite="kv-canary-cpu")
register_cuda_ci(est_time=15, suite="kv-canary-gpu")

helpers = import_triton_modules()["triton_helpers"]  # before the kernel below is decorated

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _hash_kernel(
    tokens_ptr,
    positions_ptr,
    slots_ptr,
    mask_ptr,
    due_ptr,
    every_ptr,
    mix_out_ptr,
    term_out_ptr,
    fingerprint_out_ptr,
    src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
    src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
    N: tl.constexpr,
    NUM_SOURCES: tl.constexpr,
    PARTIAL: tl.constexpr,
    WORDS0: tl.constexpr,
    WORDS1: tl.constexpr,
    WORDS2: tl.constexpr,
    WORDS3: tl.constexpr,
    WORD_CHUNK: tl.constexpr,
):
    """One block of ``N`` lanes per program (program ``i``: lanes ``[i N, (i + 1) N)``); the
    fingerprint's ``mask`` / ``due`` / ``every`` are read per lane (int64, nonzero = true)."""
    lanes = tl.program_id(0) * N + tl.arange(0, N)
    tokens = tl.load(tokens_ptr + lanes)
    positions = tl.load(positions_ptr + lanes)
    slots = tl.load(slots_ptr + lanes)
    tl.store(mix_out_ptr + lanes, helpers.mix64(tokens))
    tl.store(term_out_ptr + lanes, helpers.chain_term(tokens, positions))
    mask = tl.load(mask_ptr + lanes) != 0
    fingerprint = helpers.slot_fingerprint(
        slots, mask, slots, mask, tl.load(due_ptr + lanes), tl.load(every_ptr + lanes) != 0,
        src0_ptr, src0_rows, src0_stride, src1_ptr, src1_rows, src1_stride,
        src2_ptr, src2_rows, src2_stride, src3_ptr, src3_rows, src3_stride,
        NUM_SOURCES, PARTIAL, WORDS0, WORDS1, WORDS2, WORDS3, WORD_CHUNK, 0,
    )
    tl.store(fingerprint_out_ptr + lanes, fingerprint)


def _sources(device):
    generator = torch.Generator().manual_seed(7)
    # No 2-word source: in this one-block test kernel Triton 3.6 fails to lay out the constant
    # window of a 2-word row on a GPU ('arith.select' shape mismatch); the forward kernels, whose
    # tests use 2-word sources, compile and pass on a GPU.
    shapes = ((20, 4), (24, 6), (20, 37), (16, 5))
    sources = []
    for rows, words in shapes:
        wide = torch.randint(-(1 << 63), (1 << 63) - 1, (rows, words + 3), generator=generator,
                             dtype=torch.int64)
        sources.append(wide.to(device)[:, 1 : 1 + words])  # strided rows
    return sources


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize(
    "num_sources, partial", [(0, False), (1, True), (4, True), (1, False), (4, False)]
)
def test_triton_forms_match_the_scalar_reference(device, num_sources, partial):
    n = 32
    tokens = torch.tensor(random_values(n, seed=5), dtype=torch.int64)
    positions = torch.tensor(random_values(n, seed=6), dtype=torch.int64)
    slots = torch.tensor([*range(26), -1, -5, 30, 1 << 33, 0, 7], dtype=torch.int64)
    sources = _sources(device)[:num_sources]
    real = RealDataSources(sources=tuple(sources), partial=partial) if sources else None
    outputs = [torch.empty(n, dtype=torch.int64, device=device) for _ in range(3)]
    every_source = (torch.ones(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64),
                    torch.ones(n, dtype=torch.int64))  # mask, due, every: partial's every lane
    inputs = [t.to(device) for t in (tokens, positions, slots, *every_source)]
    _hash_kernel[(1,)](
        *inputs, *outputs, *real_data_args(real, placeholder=outputs[0]), n,
        **real_data_constexprs(real),
    )
    mix, term, fingerprint = (out.tolist() for out in outputs)
    assert mix == signed(mix64_scalar(t) for t in tokens.tolist())
    assert term == [chain_term_scalar(t, p) for t, p in zip(tokens.tolist(), positions.tolist())]
    rows = [source.cpu().tolist() for source in sources]
    assert fingerprint == [
        to_signed_i64(slot_fingerprint_scalar(slot=slot, sources=rows, partial=partial))
        for slot in slots.tolist()
    ]


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("num_sources", [1, 2, 3, 4])
def test_partial_lanes_of_due_and_every_elements_match_the_scalar_reference(device, num_sources):
    """``partial``: an element selected by ``due`` alone holds its due source's lane of the
    slot's fingerprint, one selected by ``every`` the whole fingerprint, any other 0; in blocks
    of prefix positions only (a decode row's verify tile), of new slots only (a prefill tile),
    of both, and of neither."""
    n = 32
    slots = [*range(26), -1, -5, 30, 1 << 33, 0, 7]
    blocks = (  # (mask, every) per lane
        [(True, False)] * n,
        [(True, True)] * n,
        [(lane % 3 != 2, lane % 5 == 0) for lane in range(n)],
        [(False, lane % 2 == 0) for lane in range(n)],
    )
    lane_slots = slots * len(blocks)
    mask = [m for block in blocks for m, _ in block]
    every = [e for block in blocks for _, e in block]
    due = [(3 * lane + lane // 7) % num_sources for lane in range(len(lane_slots))]
    sources = _sources(device)[:num_sources]
    real = RealDataSources(sources=tuple(sources), partial=True)
    lanes = len(lane_slots)
    zeros = [0] * lanes  # tokens and positions: the mix and chain outputs are not looked at
    inputs = [torch.tensor(values, dtype=torch.int64, device=device)
              for values in (zeros, zeros, lane_slots, mask, due, every)]
    outputs = [torch.empty(lanes, dtype=torch.int64, device=device) for _ in range(3)]
    _hash_kernel[(len(blocks),)](
        *inputs, *outputs, *real_data_args(real, placeholder=outputs[0]), n,
        **real_data_constexprs(real),
    )
    out = outputs[2]
    rows = [source.cpu().tolist() for source in sources]
    expected = []
    for slot, on, source, whole in zip(lane_slots, mask, due, every):
        full = to_signed_i64(slot_fingerprint_scalar(slot=slot, sources=rows, partial=True))
        lane = full & lane_mask_scalar(source=source, num_sources=num_sources)
        expected.append(0 if not on else full if whole else lane)
    assert out.tolist() == expected


_RUN_IN_FRESH_PROCESS = """
import os, sys
import torch
{prelude}
from sglang.jit_kernel.kv_canary import canary_forward
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    BatchLayout, CanaryBatchView, CanaryDeviceState)
table = torch.zeros((2, 4), dtype=torch.int32)
table[1, 0] = 3
state = CanaryDeviceState.zeros(num_slots=8, req_to_token=table, ring_capacity=4)
i64 = lambda *v: torch.tensor(v, dtype=torch.int64)
batch = CanaryBatchView(layout=BatchLayout.DECODE, req_pool_indices=i64(1), seq_lens=i64(1),
    extend_prefix_lens=None, extend_seq_lens=None, extend_start_loc=None, input_ids=i64(9),
    positions=i64(0), out_cache_loc=i64(3))
try:
    canary_forward.launch_pre_forward(state=state, batch=batch)
    canary_forward.launch_post_forward(state=state, batch=batch)
except ValueError as error:
    print("ValueError:", error)
    sys.exit(0)
print(state.records[3].tolist(), state.counters.tolist())
"""


def _run_fresh(prelude: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", _RUN_IN_FRESH_PROCESS.format(prelude=prelude)],
        capture_output=True, text=True, timeout=240, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU interpreter path")
def test_interprets_even_when_triton_was_imported_before_the_interpreter_was_chosen():
    prelude = "import triton, triton.language\nos.environ['TRITON_INTERPRET'] = '1'"
    chain = 0x0C0FFEE5EED5A17
    assert _run_fresh(prelude) == (
        f"[9, {chain}, 0, 1] [0, 1, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0]"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_cpu_tensors_without_the_interpreter_are_refused_by_name():
    output = _run_fresh("")
    assert output.startswith("ValueError: the canary Triton kernels need CUDA tensors")
    assert "TRITON_INTERPRET=1" in output


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
