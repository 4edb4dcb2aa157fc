"""Real SGLang 0.5.12.post1 ``ModelWorkerBatch`` objects for CPU tests and self-checks.

What the scheduler hands to ``ForwardBatch.init_new``: shared by the oracle's and the token
checks' tests so both build batches the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang.srt.managers.schedule_batch import ModelWorkerBatch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo


def greedy_sampling_info(*, rows: int, vocab_size: int) -> SamplingBatchInfo:
    """A CPU ``SamplingBatchInfo`` of ``rows`` greedy rows."""
    return SamplingBatchInfo(
        temperatures=torch.ones(rows, 1), top_ps=torch.ones(rows),
        top_ks=torch.ones(rows, dtype=torch.int32), min_ps=torch.zeros(rows),
        is_all_greedy=True, need_top_p_sampling=False, need_top_k_sampling=False,
        need_min_p_sampling=False, vocab_size=vocab_size, device="cpu",
    )


def model_worker_batch(
    *,
    mode: ForwardMode,
    reqs: Sequence[object],
    req_pool_indices: Sequence[int],
    seq_lens: Sequence[int],
    extend_prefix_lens: Sequence[int] | None,
    num_tokens: int,
    vocab_size: int,
    spec_info: object = None,
) -> ModelWorkerBatch:
    """A batch of ``reqs``; ``extend_prefix_lens`` None means one token per row (decode-like)."""
    rows = len(reqs)
    extend_seq_lens = (
        None if extend_prefix_lens is None
        else [s - p for s, p in zip(seq_lens, extend_prefix_lens)]
    )
    return ModelWorkerBatch(
        forward_mode=mode, input_ids=torch.zeros(num_tokens, dtype=torch.int64),
        req_pool_indices=torch.tensor(list(req_pool_indices), dtype=torch.int64),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=torch.arange(1, num_tokens + 1, dtype=torch.int64),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64), seq_lens_sum=sum(seq_lens),
        return_logprob=False, top_logprobs_nums=None, token_ids_logprobs=None,
        global_num_tokens=None, global_num_tokens_for_logprob=None, is_extend_in_batch=False,
        all_extend_in_batch=False, can_run_dp_cuda_graph=False, tbo_split_seq_index=None,
        global_forward_mode=None,
        extend_num_tokens=None if extend_seq_lens is None else num_tokens,
        extend_seq_lens=extend_seq_lens,
        extend_prefix_lens=None if extend_prefix_lens is None else list(extend_prefix_lens),
        extend_logprob_start_lens=None if extend_seq_lens is None else [0] * rows,
        extend_input_logprob_token_ids=None, multimodal_inputs=None, encoder_cached=None,
        encoder_lens=None, encoder_lens_cpu=None, encoder_out_cache_loc=None,
        lora_ids=[None] * rows, sampling_info=greedy_sampling_info(rows=rows, vocab_size=vocab_size),
        spec_info=spec_info, reqs=list(reqs),
    )
