"""next_token_swap: p=0 identity, p=1 swaps, warm-up, seeded reproducibility, batch of one."""

import logging
import random
import re
import sys

import pytest
import torch

from sglang.srt.kv_canary.config import PerturbConfig
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE
from sglang.srt.kv_canary.perturb.next_token_swap import (
    NextTokenSwapState,
    SampledRows,
    maybe_perturb_swap_next_tokens,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

TOKENS = torch.tensor([10, 20, 30, 40], dtype=torch.int32)
ROWS = SampledRows(rids=["a", "b", "c", "d"], next_positions=torch.tensor([5, 6, 7, 8]))


def _state(*, probability: float, warmup_steps: int = 0, seed: int = 0) -> NextTokenSwapState:
    return NextTokenSwapState(probability=probability, warmup_steps=warmup_steps,
                              rng=random.Random(seed))


def _run(state: NextTokenSwapState, tokens: torch.Tensor = TOKENS) -> torch.Tensor:
    return maybe_perturb_swap_next_tokens(next_token_ids=tokens, sampled_rows=ROWS, state=state)


def _swapped_rows(before: torch.Tensor, after: torch.Tensor) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(before.tolist(), after.tolist())) if x != y]


def test_from_config_is_none_when_off() -> None:
    assert NextTokenSwapState.from_config(PerturbConfig()) is None
    state = NextTokenSwapState.from_config(
        PerturbConfig(next_token_swap_prob=0.5, warmup_steps=3, seed=9))
    assert state.probability == 0.5 and state.warmup_steps == 3 and state.steps_seen == 0


def test_probability_zero_is_identity() -> None:
    state = _state(probability=0.0)
    for _ in range(50):
        assert _run(state) is TOKENS
    assert state.steps_seen == 50


def test_probability_one_swaps_two_rows_every_step() -> None:
    state = _state(probability=1.0)
    for _ in range(20):
        out = _run(state)
        changed = _swapped_rows(TOKENS, out)
        assert len(changed) == 2
        i, j = changed
        assert out[i] == TOKENS[j] and out[j] == TOKENS[i]
    assert TOKENS.tolist() == [10, 20, 30, 40]  # the input is never modified


def test_warmup_is_respected() -> None:
    state = _state(probability=1.0, warmup_steps=5)
    results = [_run(state) for _ in range(8)]
    assert all(out is TOKENS for out in results[:5])
    assert all(len(_swapped_rows(TOKENS, out)) == 2 for out in results[5:])


def test_batch_of_one_is_untouched_and_draws_nothing() -> None:
    state = _state(probability=1.0)
    single = torch.tensor([7], dtype=torch.int32)
    rng_state = state.rng.getstate()
    assert _run(state, single) is single
    assert state.rng.getstate() == rng_state and state.steps_seen == 1


def test_seeded_runs_reproduce() -> None:
    def trace(seed: int) -> list[list[int]]:
        state = _state(probability=0.5, warmup_steps=2, seed=seed)
        return [_run(state).tolist() for _ in range(40)]

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)


def test_one_parseable_info_line_per_swap(caplog) -> None:
    state = _state(probability=1.0, warmup_steps=1)
    with caplog.at_level(logging.INFO, logger="sglang.srt.kv_canary.perturb.next_token_swap"):
        _run(state)
        out = _run(state)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    match = PERTURB_LINE_RE.match(lines[0])
    assert match is not None, lines[0]
    assert match["fault"] == "next_token_swap" and match["step"] == "1"
    row = int(match["row"])
    partner = int(re.search(r"partner_row=(\d+)", match["detail"]).group(1))
    assert sorted(_swapped_rows(TOKENS, out)) == sorted([row, partner])
    assert match["rid"] == "abcd"[row] and match["position"] == str(5 + row)
    assert f"partner_rid={'abcd'[partner]}" in match["detail"]
    assert f"partner_position={5 + partner}" in match["detail"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
