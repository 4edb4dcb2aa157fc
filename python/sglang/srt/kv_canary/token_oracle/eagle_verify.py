"""EAGLE spec-v2 verification that follows the token oracle.

In SGLang 0.5.12 only the target model's prefill samples through the sampling backend. An EAGLE
decode step drafts with the draft model (``fast_topk`` on the draft logits, never the sampler),
runs the target in TARGET_VERIFY mode and then picks the target's tokens in
``EagleVerifyInputV2Mixin.sample`` from the target logits (``argmax`` + ``verify_tree_greedy``,
or tree speculative sampling), again without the sampling backend. Left alone, every token
after the first of each request would be the dummy model's argmax.

Around that ``sample`` (the runner's canary calls :func:`sample_verify_with_oracle` from the
hook), the target logits are
replaced for the duration of the call by one-hot logits of the oracle's token after each
verified position (``0`` at the oracle token, ``-inf`` elsewhere). Greedy verification then
predicts exactly the oracle's tokens, and so does speculative sampling (the target
distribution is a point mass): a draft token is accepted iff it equals the oracle's token, and
the bonus token is the oracle's. Every committed token is therefore an oracle token. The real
logits are put back afterwards, so logprobs (computed later from them) are the model's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sglang.srt.kv_canary.token_oracle.request_ids import generalized_req_ids_of
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager


def oracle_one_hot_logits(
    *,
    manager: TokenOracleManager,
    generalized_req_ids: torch.Tensor,
    verify_positions: torch.Tensor,
    draft_token_num: int,
    like: torch.Tensor,
) -> torch.Tensor:
    """Logits ``[rows * draft_token_num, vocab]``: 0 at the oracle's next token, -inf elsewhere.

    Args:
        generalized_req_ids: int64 ``[rows]``.
        verify_positions: ``[rows * draft_token_num]``: the position of each verified token.
        like: the real logits (shape, dtype and device of the result).
    """
    per_token_ids = generalized_req_ids.repeat_interleave(draft_token_num)
    next_tokens = manager.sample_next_tokens(
        generalized_req_ids=per_token_ids, logits_positions=verify_positions
    )
    one_hot = torch.full_like(like, float("-inf"))
    one_hot.scatter_(1, next_tokens.to(torch.int64)[:, None], 0.0)
    return one_hot


def sample_verify_with_oracle(
    *,
    manager: TokenOracleManager,
    batch: Any,
    logits_output: Any,
    draft_token_num: int,
    verify_positions: torch.Tensor,
    sample: Callable[[], Any],
) -> Any:
    """Run EAGLE v2's ``sample`` with the target logits replaced by the oracle's one-hot logits.

    Args:
        batch: the verify batch (its ``sampling_info`` carries the request ids).
        logits_output: the target's logits output; ``next_token_logits`` is swapped during
            ``sample()`` and restored afterwards.
        draft_token_num: verified tokens per request.
        verify_positions: the position of each verified token.
        sample: runs the original ``sample``.
    Raises:
        MissingRequestIdsError: the batch's sampling info has no per-request ids.
        ValueError: the logits do not hold ``draft_token_num`` rows per request.
    """
    if batch.forward_mode.is_idle():
        return sample()
    real_logits = logits_output.next_token_logits
    rows = len(batch.seq_lens)
    if real_logits.shape[0] != rows * draft_token_num:
        raise ValueError(
            f"EAGLE verify: {real_logits.shape[0]} logits rows for {rows} requests of "
            f"{draft_token_num} draft tokens"
        )
    logits_output.next_token_logits = oracle_one_hot_logits(
        manager=manager,
        generalized_req_ids=generalized_req_ids_of(batch.sampling_info)[:rows],
        verify_positions=verify_positions[: real_logits.shape[0]],
        draft_token_num=draft_token_num,
        like=real_logits,
    )
    try:
        return sample()
    finally:
        logits_output.next_token_logits = real_logits
