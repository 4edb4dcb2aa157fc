"""CanaryBatchView / CanaryDeviceState validation: clear errors naming the field, no syncs."""

import dataclasses
import sys

import pytest
import torch

from _canary_sim import canary_impl
from sglang.jit_kernel.kv_canary.batch_view import BatchLayout, CanaryBatchView, CanaryDeviceState
from sglang.jit_kernel.kv_canary.consts import NUM_COUNTERS, RECORD_FIELDS, RING_ROW_FIELDS
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="kv-canary-cpu")


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
        real_kv_words=None,
        real_kv_num_words=0,
    )
    fields.update(changes)
    return CanaryDeviceState(**fields)


def test_valid_views_and_states_build():
    assert _decode().batch_size == 2 and _decode().num_tokens == 2
    assert _extend().num_tokens == 4
    words = torch.zeros(16, 8, dtype=torch.int64)
    assert _state(real_kv_words=words, real_kv_num_words=2).num_slots == 16
    pool = torch.zeros(4, 8, dtype=torch.int32)
    _decode(expected_token_pool=pool, expected_token_valid_lens=_i64(0, 3, 0, 5))
    _decode(expected_token_pool=pool, expected_token_valid_lens=_i64(0, 3, 0, 5),
            verify_token=False)  # the history serves the write-input assert only
    _decode(expected_input_ids=_i64(7, 0))  # each write-input expectation is optional


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
        (_extend, "extend_start_loc", None, TypeError, "extend_start_loc must be a torch.Tensor"),
        (_extend, "positions", _i64(1, 2, 3), ValueError, r"positions must have shape \[4\]"),
        (_state, "records", torch.zeros(16, 3, dtype=torch.int64), ValueError, "records must be"),
        (_state, "req_to_token", torch.zeros(4, 8, dtype=torch.int64), TypeError, "req_to_token"),
        (_state, "ring", torch.zeros(0, RING_ROW_FIELDS, dtype=torch.int64), ValueError, "ring"),
        (_state, "counters", torch.zeros(3, dtype=torch.int64), ValueError, "counters"),
        (_state, "real_kv_num_words", 2, ValueError, "must be 0 when real_kv_words is None"),
    ],
)
def test_bad_fields_are_named(build, field, value, error, message):
    with pytest.raises(error, match=message):
        build(**{field: value})


def test_token_pool_needs_its_valid_lengths():
    with pytest.raises(ValueError, match="together or not at all"):
        _decode(expected_token_pool=torch.zeros(4, 8, dtype=torch.int32))


def test_token_valid_lengths_are_indexed_by_pool_row():
    pool = torch.zeros(4, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"expected_token_valid_lens must have shape \[4\]"):
        _decode(expected_token_pool=pool, expected_token_valid_lens=_i64(3, 0))  # [bs]: old
    with pytest.raises(TypeError, match="verify_token must be a bool"):
        _decode(expected_token_pool=pool, expected_token_valid_lens=_i64(0, 3, 0, 5),
                verify_token=1)


def test_real_kv_words_must_cover_the_folded_words_with_contiguous_rows():
    words = torch.zeros(16, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"real_kv_num_words must be in \[1, 4\]"):
        _state(real_kv_words=words, real_kv_num_words=5)
    with pytest.raises(ValueError, match="real_kv_words rows must be contiguous"):
        _state(real_kv_words=torch.zeros(4, 16, dtype=torch.int64).t(), real_kv_num_words=2)
    with pytest.raises(TypeError, match="real_kv_num_words must be an int"):
        _state(real_kv_words=words, real_kv_num_words=2.0)


def test_all_tensors_must_share_one_device():
    meta = torch.zeros(2, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="seq_lens is on meta"):
        _decode(seq_lens=meta)
    meta_counters = torch.zeros(NUM_COUNTERS, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="counters is on meta"):
        _state(counters=meta_counters)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_launches_refuse_a_batch_on_another_device(impl):
    meta_batch = _decode(
        **{
            f.name: torch.empty_like(getattr(_decode(), f.name), device="meta")
            for f in dataclasses.fields(CanaryBatchView)
            if isinstance(getattr(_decode(), f.name), torch.Tensor)
        }
    )
    with pytest.raises(ValueError, match="CanaryBatchView is on meta"):
        canary_impl(impl).launch_pre_forward_verify(state=_state(), batch=meta_batch)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
