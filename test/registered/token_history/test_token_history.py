"""Token-history snapshots and the expected-token pool on CPU (Triton kernel interpreted).

The incremental snapshot must leave exactly the pool the full snapshot leaves, over a schedule
with arrivals, chunked prefill, decode, finishing, retraction and row reuse, while carrying far
fewer tokens.
"""

import sys
import types

import pytest
import torch
from _triton_mode import interpret_kernels_without_cuda

interpret_kernels_without_cuda()

from _history_schedule import FakeReq, SimulatedSchedule  # noqa: E402

from sglang.jit_kernel.kv_canary.scatter_req_token_ids import launch_scatter_req_token_ids_kernel  # noqa: E402
from sglang.jit_kernel.kv_canary.scatter_req_token_ids_ref import (  # noqa: E402
    scatter_req_token_ids_torch_reference,
)
from sglang.srt.kv_canary.req_to_expected_token_ids_manager import (  # noqa: E402
    FORWARD_BATCH_ATTRIBUTE,
    ReqToVerifyExpectedTokens,
    TokenHistorySyncMode,
    attach_req_all_ids_info,
    compute_req_all_ids_info,
    populate_req_to_expected_token_ids,
)
from sglang.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=45, suite="kv-canary-cpu")

_DEVICE = "cpu"


@pytest.fixture(autouse=True)
def _cpu_only() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU variant; test_req_to_expected_token_ids_manager_gpu.py covers CUDA")


def _req(rid: str, prompt: list[int], outputs: list[int], row: int) -> FakeReq:
    req = FakeReq(rid, prompt)
    req.output_ids = outputs
    req.req_pool_idx = row
    return req


def _pool(mode: TokenHistorySyncMode, *, rows: int = 6, width: int = 16):
    return ReqToVerifyExpectedTokens(
        num_rows=rows, max_context_len=width, device=_DEVICE, sync_mode=mode
    )


def test_full_snapshot_layout() -> None:
    reqs = [_req("a", [1, 2, 3], [4], row=3), _req("b", [], [], row=1), _req("c", [9], [8], row=2)]
    info = compute_req_all_ids_info(reqs, pin_memory=False)
    assert info.batch_size == 3 and info.num_tokens == 6
    assert info.req_pool_indices.tolist() == [3, 1, 2]
    assert info.req_all_ids_lens.tolist() == [4, 0, 2]
    assert info.offsets.tolist() == [0, 4, 4, 6]
    assert info.req_all_ids_flat.tolist() == [1, 2, 3, 4, 9, 8]
    assert info.packed.dtype == torch.int64 and info.packed.device.type == "cpu"
    assert info.ownership is None


def test_empty_batch_snapshot_and_populate() -> None:
    pool = _pool(TokenHistorySyncMode.INCREMENTAL)
    info = pool.snapshot([])
    assert info.batch_size == 0 and info.num_tokens == 0 and info.offsets.tolist() == [0]
    pool.populate(info)
    assert not pool.tokens.any() and not pool.valid_lens_by_row.any()


def test_missing_req_pool_idx_names_the_request() -> None:
    req = _req("lost", [1], [], row=1)
    req.req_pool_idx = None
    for mode in TokenHistorySyncMode:
        with pytest.raises(ValueError, match="'lost'.*req_pool_idx=None"):
            _pool(mode).snapshot([req])


def test_incremental_carries_only_new_tokens_once_populated() -> None:
    pool = _pool(TokenHistorySyncMode.INCREMENTAL)
    req = _req("a", [1, 2, 3], [4], row=2)
    first = pool.snapshot([req])
    again = pool.snapshot([req])  # not populated yet: nothing is assumed written
    assert first.req_all_ids_flat.tolist() == again.req_all_ids_flat.tolist() == [1, 2, 3, 4]
    pool.populate(again)
    assert pool.snapshot([req]).num_tokens == 0  # nothing new
    req.output_ids.append(5)
    step = pool.snapshot([req])
    assert step.req_all_ids_flat.tolist() == [5]
    assert step.req_all_ids_lens.tolist() == [5]
    pool.populate(step)
    assert pool.tokens[2, :5].tolist() == [1, 2, 3, 4, 5]
    assert pool.valid_lens_by_row[2].item() == 5


@pytest.mark.parametrize(
    "change",
    ["new_owner_of_row", "retracted", "outputs_replaced", "history_shrank_in_place"],
)
def test_incremental_rewrites_row_from_zero_when_ownership_changes(change: str) -> None:
    pool = _pool(TokenHistorySyncMode.INCREMENTAL)
    req = _req("a", [1, 2, 3], [4, 5], row=2)
    pool.populate(pool.snapshot([req]))
    if change == "new_owner_of_row":
        req = _req("b", [7, 8], [9, 10, 11, 12], row=2)
    elif change == "retracted":
        req.retraction_count += 1
    elif change == "outputs_replaced":
        req.output_ids = [6, 6, 6, 6]  # a new list object, longer than what was synced
    else:
        del req.output_ids[:]
        req.output_ids.append(6)  # same list objects, a shorter history
    info = pool.snapshot([req])
    assert info.req_all_ids_flat.tolist() == req.history()
    pool.populate(info)
    assert pool.tokens[2, : len(req.history())].tolist() == req.history()


def test_row_moved_to_another_row_is_written_in_full() -> None:
    pool = _pool(TokenHistorySyncMode.INCREMENTAL)
    req = _req("a", [1, 2], [3], row=1)
    pool.populate(pool.snapshot([req]))
    req.req_pool_idx = 4
    info = pool.snapshot([req])
    assert info.req_all_ids_flat.tolist() == [1, 2, 3]
    pool.populate(info)
    assert pool.tokens[4, :3].tolist() == [1, 2, 3] and pool.valid_lens_by_row[4].item() == 3


def _assert_pool_holds_histories(pool: ReqToVerifyExpectedTokens, batch: list[FakeReq]) -> None:
    width = pool.tokens.shape[1]
    for req in batch:
        history = req.history()
        assert pool.valid_lens_by_row[req.req_pool_idx].item() == len(history)
        kept = history[:width]
        assert pool.tokens[req.req_pool_idx, : len(kept)].tolist() == kept, req.rid


def test_incremental_and_full_give_identical_pools_over_a_schedule() -> None:
    rows, width = 9, 48
    full = _pool(TokenHistorySyncMode.FULL, rows=rows, width=width)
    incremental = _pool(TokenHistorySyncMode.INCREMENTAL, rows=rows, width=width)
    schedule = SimulatedSchedule(seed=11, pool_rows=rows, max_prompt_len=56)
    tokens_moved = {TokenHistorySyncMode.FULL: 0, TokenHistorySyncMode.INCREMENTAL: 0}
    for step, batch in enumerate(schedule.batches(70)):
        if step % 9 == 4:  # a snapshot that is never populated must not leave a gap
            incremental.snapshot(batch)
        for pool in (full, incremental):
            info = pool.snapshot(batch)
            tokens_moved[pool.sync_mode] += info.num_tokens
            pool.populate(info)
        assert torch.equal(full.tokens, incremental.tokens), f"step {step}"
        assert torch.equal(full.valid_lens_by_row, incremental.valid_lens_by_row), f"step {step}"
        _assert_pool_holds_histories(incremental, batch)
    assert full.valid_lens_by_row[0].item() == 0 and not full.tokens[0].any()  # padding row
    incremental_tokens = tokens_moved[TokenHistorySyncMode.INCREMENTAL]
    assert incremental_tokens * 3 < tokens_moved[TokenHistorySyncMode.FULL]


def test_valid_lengths_are_kept_per_pool_row() -> None:
    """The kernels read ``valid_lens_by_row[req_pool_indices[b]]``: no per-batch gather."""
    pool = _pool(TokenHistorySyncMode.INCREMENTAL)
    pool.populate(pool.snapshot([_req("a", [1, 2, 3], [], row=2), _req("b", [5], [6], row=4)]))
    assert pool.valid_lens_by_row.tolist() == [0, 0, 3, 0, 2, 0]  # row 0 (padding) stays 0


def test_the_torch_reference_scatter_can_stand_in_for_the_kernel() -> None:
    for scatter in (scatter_req_token_ids_torch_reference, launch_scatter_req_token_ids_kernel):
        pool = ReqToVerifyExpectedTokens(num_rows=4, max_context_len=8, device=_DEVICE,
                                         scatter=scatter)
        req = _req("a", [7, 8], [9], row=3)
        pool.populate(pool.snapshot([req]))
        req.output_ids.append(10)
        pool.populate(pool.snapshot([req]))
        assert pool.tokens[3, :5].tolist() == [7, 8, 9, 10, 0]
        assert pool.valid_lens_by_row.tolist() == [0, 0, 0, 4]


def test_attach_then_populate_through_the_forward_batch() -> None:
    pool = _pool(TokenHistorySyncMode.INCREMENTAL)
    forward_batch = types.SimpleNamespace()
    attach_req_all_ids_info(
        forward_batch=forward_batch,
        reqs=[_req("a", [4, 5], [6], row=1)],
        req_to_verify_expected_tokens=pool,
    )
    assert getattr(forward_batch, FORWARD_BATCH_ATTRIBUTE).num_tokens == 3
    populate_req_to_expected_token_ids(
        forward_batch=forward_batch, req_to_verify_expected_tokens=pool
    )
    assert pool.tokens[1, :3].tolist() == [4, 5, 6]


def test_populate_without_snapshot_fails_loudly() -> None:
    with pytest.raises(RuntimeError, match="no 'req_all_ids_info' snapshot"):
        populate_req_to_expected_token_ids(
            forward_batch=types.SimpleNamespace(),
            req_to_verify_expected_tokens=_pool(TokenHistorySyncMode.INCREMENTAL),
        )


def test_bad_pool_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="num_rows and max_context_len must be >= 1"):
        ReqToVerifyExpectedTokens(num_rows=0, max_context_len=8, device=_DEVICE)


def test_staging_buffer_grows_for_long_histories() -> None:
    pool = _pool(TokenHistorySyncMode.INCREMENTAL, rows=3, width=8)
    long_prompt = list(range(1, 6000))  # more words than the initial device staging buffer
    pool.populate(pool.snapshot([_req("long", long_prompt, [], row=1)]))
    assert pool.tokens[1].tolist() == long_prompt[:8]
    assert pool.valid_lens_by_row[1].item() == len(long_prompt)


def test_real_sglang_req_objects() -> None:
    """The attributes read from ``Req`` exist with the expected meaning in SGLang 0.5.12.post1."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = [Req(rid=f"r{i}", origin_input_text="", origin_input_ids=[10 * i + 1, 10 * i + 2],
                sampling_params=SamplingParams()) for i in range(3)]
    for row, req in enumerate(reqs, start=1):
        req.req_pool_idx = row
    full = _pool(TokenHistorySyncMode.FULL)
    incremental = _pool(TokenHistorySyncMode.INCREMENTAL)
    for step in range(4):
        for req in reqs:
            req.output_ids.append(100 + step)
        if step == 2:
            reqs[0].reset_for_retract()  # bumps retraction_count
        for pool in (full, incremental):
            pool.populate(pool.snapshot(reqs))
        assert torch.equal(full.tokens, incremental.tokens)
        assert torch.equal(full.valid_lens_by_row, incremental.valid_lens_by_row)
    assert incremental.tokens[2, :6].tolist() == [11, 12, 100, 101, 102, 103]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
