"""The burn-in's request mix: seeded and deterministic, every ingredient in every round, page
boundaries +-1, chunked long prompts, rids safe for ``/abort_request``'s prefix match, and every
request within the server's limits."""

import itertools
import sys
from collections import Counter

import pytest

from sglang.srt.kv_canary.burnin.workload import (
    DRAINED_FLUSH_EVERY_ROUNDS,
    PARALLEL_N,
    ROUND,
    Action,
    Ingredient,
    Request,
    WorkloadShape,
    actions,
    burst_tokens,
    derive_shape,
)
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

SHAPE = WorkloadShape(page_size=16, token_low=5, token_high=4096, max_prompt_tokens=1500,
                      max_new_tokens=64, chunk_tokens=256, burst_requests=12)
ROUND_LENGTH = sum(count for _, count in ROUND)


def _take(count: int, *, shape: WorkloadShape = SHAPE, seed: int = 3) -> list[Action]:
    return list(itertools.islice(actions(shape=shape, seed=seed, rid_prefix="t"), count))


def _requests(taken: list[Action]) -> list[Request]:
    return [request for action in taken for request in action.requests]


def test_the_same_seed_gives_the_same_actions_and_another_seed_others() -> None:
    assert _take(200) == _take(200)
    assert _take(200) != _take(200, seed=4)


def test_every_round_holds_every_ingredient_in_its_counts() -> None:
    taken = _take(6 * ROUND_LENGTH + 2)
    rounds, index = [], 0
    for number in range(6):
        drained = number % DRAINED_FLUSH_EVERY_ROUNDS == 1
        if drained:
            assert taken[index].ingredient is Ingredient.FLUSH and taken[index].drain
            index += 1
        rounds.append(taken[index:index + ROUND_LENGTH])
        index += ROUND_LENGTH
    for actions_of_round in rounds:
        counts = Counter(action.ingredient.value for action in actions_of_round)
        assert counts == dict(ROUND)
        assert not any(action.drain for action in actions_of_round)
    assert [a.index for a in taken] == list(range(len(taken)))
    assert {i.value for i in Ingredient} == {name for name, _ in ROUND}


def test_shared_prefixes_sit_at_page_boundaries_plus_minus_one() -> None:
    taken = _take(20 * ROUND_LENGTH)
    page = SHAPE.page_size
    page_prefixes = [a.requests[0] for a in taken if a.ingredient is Ingredient.PAGE_PREFIX]
    offsets = Counter()
    for request in page_prefixes:
        offset = (request.shared_prefix + 1) % page - 1  # -1, 0 or +1 around a boundary
        assert offset in (-1, 0, 1), request.shared_prefix
        offsets[offset] += 1
    assert set(offsets) == {-1, 0, 1}
    # Prompts of one base agree on their shorter shared prefix: they share it in the radix tree.
    by_base: dict[int, list[Request]] = {}
    for request in page_prefixes:
        by_base.setdefault(request.input_ids[0], []).append(request)
    assert len(by_base) == 4
    for group in by_base.values():
        for first, second in itertools.combinations(group, 2):
            shared = min(first.shared_prefix, second.shared_prefix)
            assert first.input_ids[:shared] == second.input_ids[:shared]
    suffixes = {len(r.input_ids) - r.shared_prefix for r in page_prefixes}
    assert {0, 1, page - 1, page, page + 1} <= suffixes
    generations = {r.max_new_tokens for r in page_prefixes}
    assert {1, page - 1, page, page + 1} <= generations


def test_long_prompts_span_several_prefill_chunks_and_hit_chunk_boundaries() -> None:
    taken = _take(20 * ROUND_LENGTH)
    chunk = SHAPE.chunk_tokens
    lengths = [len(a.requests[0].input_ids) for a in taken
               if a.ingredient is Ingredient.LONG_CHUNKED]
    assert lengths and all(chunk < n <= SHAPE.max_prompt_tokens for n in lengths)
    assert any((n + 1) % chunk in (0, 1, 2) for n in lengths)  # a chunk boundary +-1
    assert max(lengths) > 2 * chunk


def test_long_prompts_without_a_known_chunk_size_are_half_to_all_of_the_maximum() -> None:
    shape = WorkloadShape(page_size=1, token_low=5, token_high=100, max_prompt_tokens=200,
                          max_new_tokens=8, chunk_tokens=None, burst_requests=4)
    lengths = [len(a.requests[0].input_ids) for a in _take(10 * ROUND_LENGTH, shape=shape)
               if a.ingredient is Ingredient.LONG_CHUNKED]
    assert lengths and all(100 <= n <= 200 for n in lengths)
    assert not shape.chunked_prompts and SHAPE.chunked_prompts


def test_parallel_sampling_bursts_aborts_disconnects_and_flushes() -> None:
    taken = _take(8 * ROUND_LENGTH)
    kinds: dict[Ingredient, list[Action]] = {}
    for action in taken:
        kinds.setdefault(action.ingredient, []).append(action)
    parallel = [a.requests[0] for a in kinds[Ingredient.PARALLEL_N]]
    assert {r.n for r in parallel} <= set(PARALLEL_N) and len({r.n for r in parallel}) > 1
    assert all(r.temperature > 0 for r in parallel)
    for burst in kinds[Ingredient.RETRACTION_BURST]:
        assert len(burst.requests) == SHAPE.burst_requests
        assert all(r.max_new_tokens == SHAPE.max_new_tokens for r in burst.requests)
    for abort in kinds[Ingredient.ABORT]:
        assert 0.02 <= abort.delay_s <= 1.5 and abort.requests[0].max_new_tokens == 64
    assert any(len(a.requests[0].input_ids) > SHAPE.chunk_tokens
               for a in kinds[Ingredient.ABORT])  # aborted during a chunked prefill
    disconnects = kinds[Ingredient.DISCONNECT]
    assert {a.streaming for a in disconnects} == {True, False}
    flushes = kinds[Ingredient.FLUSH]
    assert {a.drain for a in flushes} == {True, False} and all(not a.requests for a in flushes)
    mixed = [a.requests[0] for a in kinds[Ingredient.MIXED]]
    assert any(r.text is not None for r in mixed) and any(r.input_ids for r in mixed)
    assert any(r.input_ids is not None and len(r.input_ids) == 1 for r in mixed)
    # A repeat sends an earlier prompt again (before any prompt: a fresh shared prefix).
    repeated = [a.requests[0] for a in kinds[Ingredient.REPEAT] if not a.requests[0].shared_prefix]
    earlier = {r.input_ids or r.text for r in _requests(taken) if r not in repeated}
    assert len(repeated) >= 10 and all((r.input_ids or r.text) in earlier for r in repeated)


def test_rids_are_unique_and_none_is_a_prefix_of_another() -> None:
    rids = sorted(r.rid for r in _requests(_take(10 * ROUND_LENGTH)))
    assert len(rids) == len(set(rids))
    # /abort_request aborts every rid starting with the given one; sorted, a prefix comes
    # right before the rids it starts.
    assert not any(after.startswith(before) for before, after in zip(rids, rids[1:]))
    assert all(rid.startswith("t-") for rid in rids)


def test_every_request_fits_the_shape() -> None:
    for request in _requests(_take(10 * ROUND_LENGTH)):
        assert 1 <= request.max_new_tokens <= SHAPE.max_new_tokens
        if request.input_ids is not None:
            assert 1 <= len(request.input_ids) <= SHAPE.max_prompt_tokens
            assert all(SHAPE.token_low <= i < SHAPE.token_high for i in request.input_ids)
        else:
            assert 1 <= len(request.text.split()) <= 60


def test_the_payload_is_sglang_s_native_generate_body() -> None:
    request = Request(rid="r-1", input_ids=(5, 6), max_new_tokens=3, n=4, temperature=0.8)
    assert request.payload() == {
        "rid": "r-1", "input_ids": [5, 6],
        "sampling_params": {"max_new_tokens": 3, "temperature": 0.8, "ignore_eos": True, "n": 4}}
    text = Request(rid="r-2", text="hello", max_new_tokens=1)
    assert text.payload(stream=True) == {
        "rid": "r-2", "text": "hello", "stream": True,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0, "ignore_eos": True}}
    with pytest.raises(ValueError, match="exactly one of input_ids and text"):
        Request(rid="r-3", max_new_tokens=1)


def test_the_shape_follows_the_server_s_limits() -> None:
    shape = derive_shape(page_size=16, token_ids=(5, 4096), max_new_tokens=256,
                         max_prompt_tokens=None, burst_requests=None, chunk_tokens=1024,
                         max_input_tokens=4095, kv_pool_tokens=8192)
    assert shape.max_new_tokens == 256
    assert shape.max_prompt_tokens == 8192 // 4 - 256  # a quarter of the pool at most
    assert 8 <= shape.burst_requests <= 256
    assert burst_tokens(shape) >= 1.5 * 8192  # a burst outgrows the pool
    roomy = derive_shape(page_size=16, token_ids=(5, 4096), max_new_tokens=256,
                         max_prompt_tokens=None, burst_requests=None, chunk_tokens=1024,
                         max_input_tokens=4095, kv_pool_tokens=10**6)
    assert roomy.max_prompt_tokens == 4095 - 256 - 1  # the server's longest input
    assert roomy.burst_requests == 256
    unknown = derive_shape(page_size=1, token_ids=(5, 4096), max_new_tokens=256,
                           max_prompt_tokens=None, burst_requests=None, chunk_tokens=None,
                           max_input_tokens=None, kv_pool_tokens=None)
    assert (unknown.max_prompt_tokens, unknown.burst_requests) == (2048, 32)
    short = derive_shape(page_size=1, token_ids=(5, 4096), max_new_tokens=1000,
                         max_prompt_tokens=None, burst_requests=3, chunk_tokens=None,
                         max_input_tokens=600, kv_pool_tokens=None)
    assert short.max_new_tokens == 300 and short.burst_requests == 3


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"max_prompt_tokens": 4000}, "--max-prompt-tokens=4000 plus --max-new-tokens=256 "
                                      "exceed the server's longest input (4095 tokens)"),
        ({"page_size": 2048}, "leave no room for pages of 2048"),
    ],
)
def test_a_shape_without_room_is_refused_naming_the_flags(overrides, fragment) -> None:
    arguments = dict(page_size=16, token_ids=(5, 4096), max_new_tokens=256,
                     max_prompt_tokens=None, burst_requests=None, chunk_tokens=1024,
                     max_input_tokens=4095, kv_pool_tokens=16384)
    arguments.update(overrides)
    with pytest.raises(ValueError) as refused:
        derive_shape(**arguments)
    assert fragment in str(refused.value)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
