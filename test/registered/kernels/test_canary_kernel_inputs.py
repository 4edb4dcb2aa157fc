"""Validation of the launch inputs (CanaryBatchView, CanaryDeviceState, RealDataSources,
SweepEntries): clear errors naming the field, from attributes only (no syncs)."""

import dataclasses
import sys

import pytest
import torch

from _canary_sim import canary_impl, sweep_impl
from sglang.jit_kernel.kv_canary.consts import NUM_COUNTERS, RECORD_FIELDS, RING_ROW_FIELDS
from sglang.jit_kernel.kv_canary.kernel_inputs import (
    BatchLayout,
    CanaryBatchView,
    CanaryDeviceState,
    RealDataSources,
    SweepEntries,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=3, suite="kv-canary-cpu")


def _i64(*values, device="cpu"):
    return torch.tensor(values, dtype=torch.int64, device=device)


def _decode(**changes) -> CanaryBatchView:
    fields = dict(
        layout=BatchLayout.DECODE,
        req_pool_indices=_i64(1, 0),
        seq_lens=_i64(5, 1),
        extend_prefix_lens=None,
        extend_seq_lens=None,
        extend_start_loc=None,
        input_ids=_i64(7, 0),
        positions=_i64(4, 0),
        out_cache_loc=_i64(9, 0),
    )
    fields.update(changes)
    return CanaryBatchView(**fields)


def _extend(**changes) -> CanaryBatchView:
    i32 = torch.int32
    fields = dict(
        layout=BatchLayout.EXTEND,
        req_pool_indices=_i64(1, 2),
        seq_lens=_i64(3, 2),
        extend_prefix_lens=torch.tensor([1, 0], dtype=i32),
        extend_seq_lens=torch.tensor([2, 2], dtype=i32),
        extend_start_loc=torch.tensor([0, 2], dtype=i32),
        input_ids=_i64(1, 2, 3, 4),
        positions=_i64(1, 2, 0, 1),
        out_cache_loc=_i64(5, 6, 7, 8),
    )
    fields.update(changes)
    return CanaryBatchView(**fields)


def _state(**changes) -> CanaryDeviceState:
    fields = dict(
        records=torch.zeros(16, RECORD_FIELDS, dtype=torch.int64),
        req_to_token=torch.zeros(4, 8, dtype=torch.int32),
        ring=torch.zeros(8, RING_ROW_FIELDS, dtype=torch.int64),
        counters=torch.zeros(NUM_COUNTERS, dtype=torch.int64),
        owner_chains=torch.zeros(4, dtype=torch.int64),
        real_data=None,
    )
    fields.update(changes)
    return CanaryDeviceState(**fields)


def _words(rows=16, words=4):
    return torch.zeros(rows, words, dtype=torch.int64)


def _sweep(**changes) -> SweepEntries:
    fields = dict(slots=_i64(3, 4), prev_slots=_i64(-1, 3), positions=_i64(0, 1),
                  tokens=_i64(5, -1))
    fields.update(changes)
    return SweepEntries(**fields)


def test_valid_inputs_build():
    assert _decode().batch_size == 2 and _decode().num_tokens == 2
    assert _extend().num_tokens == 4
    real = RealDataSources(sources=(_words(), _words(20, 6), _words(), _words(16, 2)),
                           partial=True)
    assert real.words_per_row == (4, 6, 4, 2)
    assert _state(real_data=real).num_slots == 16
    history = torch.zeros(4, 8, dtype=torch.int32)
    lens = _i64(0, 3, 0, 5)
    assert _decode(token_history=history, token_history_lens=lens).verifies_tokens
    assert not _decode(token_history=history, token_history_lens=lens,
                       verify_token=False).verifies_tokens
    _decode(expected_input_ids=_i64(7, 0))  # each write-input expectation is optional
    _decode(host_seq_lens=_i64(5, 1))
    assert _sweep().count == 2
    state = CanaryDeviceState.zeros(
        num_slots=32, req_to_token=torch.zeros(3, 5, dtype=torch.int32), ring_capacity=4
    )
    assert state.owner_chains.shape == (3,) and state.ring_capacity == 4


def test_int32_and_int64_index_tensors_are_accepted():
    _decode(req_pool_indices=torch.tensor([1, 0], dtype=torch.int32), input_ids=_i64(7, 0))
    _extend(extend_prefix_lens=_i64(1, 0))


@pytest.mark.parametrize(
    "build, field, value, error, message",
    [
        (_decode, "seq_lens", torch.tensor([5.0, 1.0]), TypeError, "seq_lens must be"),
        (_decode, "seq_lens", _i64(5), ValueError, r"seq_lens must have shape \[2\]"),
        (_decode, "input_ids", _i64(1, 2, 3), ValueError, "one token per row"),
        (_decode, "positions", _i64(1, 2, 3, 4)[::2], ValueError, "positions must be contiguous"),
        (_decode, "extend_seq_lens", _i64(1, 1), ValueError, "DECODE takes no extend tensors"),
        (_decode, "out_cache_loc", [9, 0], TypeError, "out_cache_loc must be a torch.Tensor"),
        (_decode, "layout", 0, TypeError, "layout must be a BatchLayout"),
        (_decode, "expected_input_ids", _i64(1, 2).int(), TypeError, "expected_input_ids must be"),
        (_decode, "host_seq_lens", _i64(5, 1).int(), TypeError, "host_seq_lens must be"),
        (_decode, "host_seq_lens", _i64(5), ValueError, r"host_seq_lens must have shape \[2\]"),
        (_decode, "verify_token", 1, TypeError, "verify_token must be a bool"),
        (_extend, "extend_start_loc", None, TypeError, "extend_start_loc must be a torch.Tensor"),
        (_extend, "positions", _i64(1, 2, 3), ValueError, r"positions must have shape \[4\]"),
        (_state, "records", torch.zeros(16, 3, dtype=torch.int64), ValueError, "records must be"),
        (_state, "req_to_token", torch.zeros(4, 8, dtype=torch.int64), TypeError, "req_to_token"),
        (_state, "ring", torch.zeros(0, RING_ROW_FIELDS, dtype=torch.int64), ValueError, "ring"),
        (_state, "counters", torch.zeros(3, dtype=torch.int64), ValueError, "counters"),
        (_state, "owner_chains", _i64(0, 0, 0), ValueError, r"owner_chains must have shape \[4\]"),
        (_state, "owner_chains", torch.zeros(4, dtype=torch.int32), TypeError, "owner_chains"),
        (_state, "real_data", _words(), TypeError, "real_data must be RealDataSources"),
        (_sweep, "tokens", _i64(1), ValueError, r"SweepEntries.tokens must have shape \[2\]"),
        (_sweep, "prev_slots", _i64(1, 2).int(), TypeError, "SweepEntries.prev_slots must be"),
    ],
)
def test_bad_fields_are_named(build, field, value, error, message):
    with pytest.raises(error, match=message):
        build(**{field: value})


def test_token_history_needs_its_lengths_indexed_by_pool_row():
    history = torch.zeros(4, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="together or not at all"):
        _decode(token_history=history)
    with pytest.raises(ValueError, match=r"token_history_lens must have shape \[4\]"):
        _decode(token_history=history, token_history_lens=_i64(3, 0))  # [bs], not [R_h]
    with pytest.raises(TypeError, match="token_history must be torch.int32"):
        _decode(token_history=history.long(), token_history_lens=_i64(0, 3, 0, 5))


@pytest.mark.parametrize(
    "sources, partial, error, message",
    [
        ((), False, ValueError, "1 to 4 tensors"),
        (tuple(_words() for _ in range(5)), False, ValueError, "1 to 4 tensors"),
        ([_words()], False, TypeError, "must be a tuple"),
        ((_words(), _words().int()), False, TypeError, r"sources\[1\] must be torch.int64"),
        ((_words(16, 1),), True, ValueError, r"sources\[0\]: partial fingerprints need"),
        ((torch.zeros(4, 16, dtype=torch.int64).t(),), False, ValueError,
         r"sources\[0\] rows must be contiguous"),
        ((_words()[0],), False, ValueError, "two-dimensional"),
        ((_words(),), 1, TypeError, "partial must be a bool"),
        ((_words(), _words().to("meta")), False, ValueError, r"sources\[1\] is on meta"),
    ],
)
def test_real_data_sources_are_validated(sources, partial, error, message):
    with pytest.raises(error, match=message):
        RealDataSources(sources=sources, partial=partial)


@pytest.mark.parametrize("stride", [0, -1, True, 2.0, (1 << 20) + 1])
def test_the_real_data_stride_is_validated(stride):
    with pytest.raises(ValueError, match="verify_stride must be an int in"):
        RealDataSources(sources=(_words(),), partial=False, verify_stride=stride)


def test_with_expected_inputs_equals_replace_and_validates_only_the_expectations():
    view = _extend()
    tokens, positions = _i64(1, 2, 3, 4), _i64(1, 2, 0, 1)
    given = view.with_expected_inputs(expected_input_ids=tokens, expected_positions=positions)
    assert given == dataclasses.replace(view, expected_input_ids=tokens,
                                        expected_positions=positions)
    assert given.expected_input_ids is tokens and given.expected_positions is positions
    assert view.expected_input_ids is None  # the view itself is unchanged
    with pytest.raises(ValueError, match=r"CanaryBatchView.expected_input_ids must have shape \[4\]"):
        view.with_expected_inputs(expected_input_ids=_i64(1, 2), expected_positions=positions)
    with pytest.raises(TypeError, match="CanaryBatchView.expected_positions must be torch.int64"):
        view.with_expected_inputs(expected_input_ids=tokens,
                                  expected_positions=positions.to(torch.int32))
    meta = torch.zeros(4, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="CanaryBatchView.expected_input_ids is on meta"):
        view.with_expected_inputs(expected_input_ids=meta, expected_positions=positions)


def test_all_tensors_must_share_one_device():
    meta = torch.zeros(2, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="seq_lens is on meta"):
        _decode(seq_lens=meta)
    with pytest.raises(ValueError, match="counters is on meta"):
        _state(counters=torch.zeros(NUM_COUNTERS, dtype=torch.int64, device="meta"))
    meta_real = RealDataSources(sources=(_words().to("meta"),), partial=False)
    with pytest.raises(ValueError, match="real_data is on meta"):
        _state(real_data=meta_real)
    with pytest.raises(ValueError, match="SweepEntries.positions is on meta"):
        _sweep(positions=meta)


def _on_meta(value):
    tensors = {
        f.name: torch.empty_like(getattr(value, f.name), device="meta")
        for f in dataclasses.fields(value)
        if isinstance(getattr(value, f.name), torch.Tensor)
    }
    return dataclasses.replace(value, **tensors)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_launches_refuse_inputs_on_another_device(impl):
    launches = canary_impl(impl)
    for launch in (launches.launch_pre_forward, launches.launch_post_forward):
        with pytest.raises(ValueError, match="CanaryBatchView is on meta"):
            launch(state=_state(), batch=_on_meta(_decode()))
    with pytest.raises(ValueError, match="SweepEntries is on meta"):
        sweep_impl(impl).launch_sweep(state=_state(), entries=_on_meta(_sweep()))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
