"""The ``input_ids`` perturbation: which token it picks (CPU lengths only), how it changes it
(exactly one element, always to another valid id), undo, seeding, the log line, the injector
wiring, and that a replayed decode graph consumes the perturbed token (SGLang's own
``DecodeInputBuffers.populate_from_forward_batch`` copies it into the static buffer)."""

import logging
import random
import sys
from collections import Counter

import pytest
import torch

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState
from sglang.srt.kv_canary.config import PerturbConfig
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE
from sglang.srt.kv_canary.perturb.injector import build_fault_injector
from sglang.srt.kv_canary.perturb.input_ids import InputIdsPerturbation, new_token_ranges
from sglang.srt.kv_canary.perturb.live_rows import live_rows
from sglang.srt.model_executor.cuda_graph_runner import DecodeInputBuffers
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

_VOCAB = 50


def _decode(seq_lens: list[int]) -> ForwardBatch:
    rows = len(seq_lens)
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE, batch_size=rows,
        input_ids=torch.arange(10, 10 + rows, dtype=torch.int64),
        req_pool_indices=torch.arange(1, rows + 1), seq_lens=torch.tensor(seq_lens),
        out_cache_loc=torch.arange(100, 100 + rows), seq_lens_sum=sum(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens), positions=torch.tensor(seq_lens) - 1,
        rids=[f"r{i}" for i in range(rows)],
    )


def _extend(prefix_lens: list[int], extend_lens: list[int], *,
            mode: ForwardMode = ForwardMode.EXTEND) -> ForwardBatch:
    num_tokens = sum(extend_lens)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    return ForwardBatch(
        forward_mode=mode, batch_size=len(prefix_lens),
        input_ids=torch.arange(20, 20 + num_tokens, dtype=torch.int64),
        req_pool_indices=torch.arange(1, len(prefix_lens) + 1),
        seq_lens=torch.tensor(seq_lens), out_cache_loc=torch.arange(1, num_tokens + 1),
        seq_lens_sum=sum(seq_lens), extend_prefix_lens_cpu=prefix_lens,
        extend_seq_lens_cpu=extend_lens, rids=[f"r{i}" for i in range(len(prefix_lens))],
    )


def test_new_token_ranges_come_from_the_cpu_lengths() -> None:
    decode = _decode([4, 9, 2])
    assert new_token_ranges(decode, live_rows(decode)) == [(0, 1), (1, 1), (2, 1)]
    mixed = _extend([0, 5, 8], [6, 0, 1], mode=ForwardMode.MIXED)
    assert new_token_ranges(mixed, live_rows(mixed)) == [(0, 6), (6, 0), (6, 1)]
    mixed.extend_seq_lens_cpu = None
    with pytest.raises(ValueError, match="extend_seq_lens_cpu in MIXED mode"):
        new_token_ranges(mixed, live_rows(mixed))


def test_exactly_one_new_token_changes_to_another_valid_id_and_undo_restores_it() -> None:
    perturbation = InputIdsPerturbation(vocab_size=_VOCAB)
    for seed in range(40):
        batch = _extend([0, 5, 8], [6, 0, 3])
        before = batch.input_ids.clone()
        fault = perturbation.inject(forward_batch=batch, rows=live_rows(batch),
                                    rng=random.Random(seed), step=0)
        changed = (batch.input_ids != before).nonzero().flatten().tolist()
        assert len(changed) == 1
        index = changed[0]
        assert 0 <= int(batch.input_ids[index]) < _VOCAB
        first, count = {0: (0, 6), 2: (6, 3)}[fault.row.row]  # row 1 writes no token
        assert first <= index < first + count
        assert fault.position == fault.row.prefix_len + (index - first)
        assert f"token_index={index}" in fault.detail
        fault.undo()
        assert torch.equal(batch.input_ids, before)


def test_the_choice_is_seeded_and_covers_every_written_token() -> None:
    perturbation = InputIdsPerturbation(vocab_size=_VOCAB)

    def choices(seed: int) -> list[tuple[int, int]]:
        rng = random.Random(seed)
        picked = []
        for _ in range(300):
            batch = _extend([0, 5, 8], [2, 0, 3])
            fault = perturbation.inject(forward_batch=batch, rows=live_rows(batch), rng=rng, step=0)
            picked.append((fault.row.row, fault.position))
        return picked

    assert choices(3) == choices(3)
    counts = Counter(choices(4))
    assert set(counts) == {(0, 0), (0, 1), (2, 8), (2, 9), (2, 10)}


def test_no_row_with_a_new_token_means_no_fault() -> None:
    batch = _extend([3, 4], [0, 0])
    assert InputIdsPerturbation(vocab_size=_VOCAB).inject(
        forward_batch=batch, rows=live_rows(batch), rng=random.Random(0), step=0) is None


def test_a_vocabulary_of_one_token_cannot_be_perturbed() -> None:
    with pytest.raises(ValueError, match="vocab_size=1 is invalid"):
        InputIdsPerturbation(vocab_size=1)


def _state() -> CanaryDeviceState:
    return CanaryDeviceState.zeros(num_slots=8, req_to_token=torch.zeros(4, 8, dtype=torch.int32),
                                   ring_capacity=4)


def test_the_injector_fires_after_the_warm_up_and_logs_the_standard_line(caplog) -> None:
    caplog.set_level(logging.INFO, logger="sglang.srt.kv_canary")
    injector = build_fault_injector(
        config=PerturbConfig(warmup_steps=2, seed=5, input_ids_prob=1.0), state=_state(),
        pool=None, vocab_size=_VOCAB,
    )
    for step in range(4):
        batch = _decode([4, 9])
        faults = injector.before_forward(forward_batch=batch, step=step)
        assert len(faults) == (0 if step < 2 else 1)
    lines = [m for m in map(PERTURB_LINE_RE.search, caplog.messages) if m]
    assert [int(m["step"]) for m in lines] == [2, 3]
    assert all(m["fault"] == "input_ids" and "delta=" in m["detail"] for m in lines)
    assert all(int(m["position"]) in (3, 8) for m in lines)  # a decode row's token position


def test_a_replayed_decode_graph_consumes_the_perturbed_token() -> None:
    """The injection happens before ``ModelRunner.forward``; a graph replay then copies
    ``forward_batch.input_ids`` into the graph's static buffer (0.5.12.post1's
    ``DecodeInputBuffers.populate_from_forward_batch``)."""
    buffers = DecodeInputBuffers.create(
        device="cpu", max_bs=4, max_num_token=4, hidden_size=8, vocab_size=16,
        dtype=torch.float32, dp_size=1, pp_size=1, is_encoder_decoder=False,
        require_mlp_tp_gather=False, seq_len_fill_value=1, encoder_len_fill_value=0,
        num_tokens_per_bs=1, cache_loc_dtype=torch.int64, enable_mamba_track=False,
    )
    batch = _decode([4, 9])
    fault = InputIdsPerturbation(vocab_size=_VOCAB).inject(
        forward_batch=batch, rows=live_rows(batch), rng=random.Random(1), step=0)
    perturbed = batch.input_ids.clone()
    buffers.populate_from_forward_batch(
        forward_batch=batch, raw_bs=2, raw_num_token=2, bs=4, seq_len_fill_value=1,
        require_gathered_buffer=False, num_tokens_per_bs=1, nsa_enable_prefill_cp=False,
        enable_num_token_non_padded_flag=False,
    )
    assert torch.equal(buffers.input_ids[:2], perturbed)
    fault.undo()  # after the forward: the live batch is restored, the graph consumed the fault
    assert not torch.equal(buffers.input_ids[:2], batch.input_ids)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
