"""A padded or repeated batch row never changes a live row's canary state.

A replayed CUDA graph runs ``bs`` static rows of which the scheduler sent ``live_rows``; SGLang
0.5.12 can leave an earlier replay's ``req_pool_idx`` in the padded ones. Such a row, and a row
repeating an earlier live row's ``req_pool_idx``, is reported once per forward
(``PADDED_ROW``) and changes no record, no owner chain and no check of the live rows: the state
after the forward equals that of the same forward without the row, and later forwards of the
live rows stay clean.

Run on the torch reference and the Triton kernels against a twin simulation that never saw the
row; expectations are explicit ring rows.
"""

import dataclasses
import sys

import pytest
import torch

from _canary_sim import IMPLS, KvSim, PaddedRow, Violation, canary_impl, prefilled
from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")
register_cuda_ci(est_time=30, suite="kv-canary-gpu")

pytestmark = pytest.mark.parametrize("impl, device", IMPLS)

PRE = CheckKind.PRE_VERIFY
TOKENS = [[10 * r + k for k in range(12)] for r in range(40)]


def _padded(step: int, *, row: int, rp: int, live: int) -> Violation:
    return Violation(PRE, Reason.PADDED_ROW, rp, 0, row, -1, -1, row, live, step)


def _twins(impl, device, *, requests: int, prefill: int = 5, **options):
    """Two identical simulations of ``requests`` prefilled requests (step 0)."""
    prompts = [(TOKENS[r], prefill) for r in range(requests)]
    return (prefilled(impl, device, prompts=prompts, **options)[0],
            prefilled(impl, device, prompts=prompts, **options)[0])


def _with_rows(view, *, req_pool_indices: list[int], live_rows: int | None):
    """``view`` with its rows' request rows replaced and ``live_rows`` set (None: absent)."""
    device = view.req_pool_indices.device
    return dataclasses.replace(
        view,
        req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64, device=device),
        live_rows=None if live_rows is None else torch.tensor([live_rows], device=device),
    )


def _assert_same_live_state(sim: KvSim, twin: KvSim) -> None:
    assert torch.equal(sim.state.records, twin.state.records)
    assert torch.equal(sim.state.owner_chains, twin.state.owner_chains)


def test_stale_graph_padding_changes_no_live_row(impl, device):
    """Decode graph padding that carries live requests' rows (0.5.12 without the padded-row
    fix): reported per padded row, records and owner chains as without it, later steps clean."""
    sim, twin = _twins(impl, device, requests=2)
    launches = canary_impl(impl)
    padded = sim.decode_batch([1, 2], padded_rows=2)
    sim.forward(launches, _with_rows(padded, req_pool_indices=[1, 2, 2, 1], live_rows=2))
    twin.forward(launches, twin.decode_batch([1, 2]))
    assert sim.violations() == sorted(
        [_padded(1, row=2, rp=2, live=2), _padded(1, row=3, rp=1, live=2)]
    )
    _assert_same_live_state(sim, twin)
    sim.consume()
    for _ in range(2):
        sim.forward(launches, sim.decode_batch([1, 2]))
    assert sim.violations() == []


def test_padding_with_row_zero_is_not_reported(impl, device):
    """The padded-row fix in place (padded rows at request row 0): nothing to report."""
    sim, twin = _twins(impl, device, requests=2)
    launches = canary_impl(impl)
    sim.forward(launches, _with_rows(sim.decode_batch([1, 2], padded_rows=2),
                                     req_pool_indices=[1, 2, 0, 0], live_rows=2))
    twin.forward(launches, twin.decode_batch([1, 2]))
    assert sim.violations() == []
    _assert_same_live_state(sim, twin)


def test_a_row_repeating_a_live_row_changes_nothing(impl, device):
    """A row inside the batch that repeats an earlier row's request row, with a slot of its own:
    reported, its slot not written, the first row's state as without it."""
    sim, twin = _twins(impl, device, requests=2)
    launches = canary_impl(impl)
    stray_slot = sim.free_pages[0] * sim.page_size
    batch = sim.decode_batch([1, 2, PaddedRow(prefix_len=5, stale_slot=stray_slot)])
    sim.forward(launches, _with_rows(batch, req_pool_indices=[1, 2, 1], live_rows=None))
    twin.forward(launches, twin.decode_batch([1, 2]))
    assert sim.violations() == [_padded(1, row=2, rp=1, live=3)]
    assert sim.record(stray_slot).stamp == 0
    _assert_same_live_state(sim, twin)


def test_a_repeat_far_behind_its_first_row_is_found(impl, device):
    """The repeated-row check walks every earlier row (in steps of several rows), not only its
    neighbours."""
    requests = 20
    sim, twin = _twins(impl, device, requests=requests, req_rows=32, num_pages=128)
    launches = canary_impl(impl)
    live = list(range(1, requests + 1))
    batch = sim.decode_batch(live + [PaddedRow(prefix_len=5)])
    sim.forward(launches, _with_rows(batch, req_pool_indices=live + [1], live_rows=None))
    twin.forward(launches, twin.decode_batch(live))
    assert sim.violations() == [_padded(1, row=requests, rp=1, live=requests + 1)]
    _assert_same_live_state(sim, twin)


def test_extend_rows_past_the_live_rows_change_nothing(impl, device):
    """An EXTEND batch padded past its live rows (piecewise or DP-attention padding) with a
    padded row that carries another live request's row and tokens."""
    sim, twin = _twins(impl, device, requests=2)
    launches = canary_impl(impl)
    batch = sim.extend_batch([(1, 3), PaddedRow(prefix_len=5, new_tokens=2)])
    sim.forward(launches, _with_rows(batch, req_pool_indices=[1, 2], live_rows=1))
    twin.forward(launches, twin.extend_batch([(1, 3)]))
    assert sim.violations() == [_padded(1, row=1, rp=2, live=1)]
    _assert_same_live_state(sim, twin)
    sim.consume()
    sim.forward(launches, sim.decode_batch([1, 2]))
    assert sim.violations() == []


def test_live_rows_beyond_the_batch_mean_every_row(impl, device):
    """A live row count larger than the batch is clipped to it."""
    sim, twin = _twins(impl, device, requests=2)
    launches = canary_impl(impl)
    sim.forward(launches, _with_rows(sim.decode_batch([1, 2]), req_pool_indices=[1, 2],
                                     live_rows=7))
    twin.forward(launches, twin.decode_batch([1, 2]))
    assert sim.violations() == []
    _assert_same_live_state(sim, twin)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
