"""End-to-end on a GPU: the canary over SGLang's hybrid sliding-window pool (``SWAKVPool``), on
a tiny dummy-weight GPT-OSS (layers alternating sliding-window and full attention, window 127:
``sliding_window`` 128) served with Triton attention.

1. Clean runs in ``raise`` mode with every check (real data, sweep, token oracle, write-input
   and verify-token asserts), with CUDA graphs at page size 1 and without them at page size 16:
   prompts several windows long, shared prefixes, decode long enough that SGLang frees the
   SWA slots behind each window, and more tokens than either sub-pool holds (SWA slots freed
   and reused): zero violations, every forward polled.
2. Faults in log mode, each caught at its step with its reason: a sliding-window mapping entry
   redirected (``window_table``: ``verify_window_owner``), a byte flipped in the sliding-window
   sub-pool inside a window (``real_kv_used``: ``verify_real_kv_hash``), and in the full sub-pool
   a redirected ``req_to_token`` entry and a flipped byte of a live slot. Persistent flips are
   reported by a later check: a byte of a slot just written (``real_kv_post_forward``, SWA
   sub-pool) by the request's next forward, one of an unused cached slot by the sweep.
"""

import random
import sys

import pytest

from _workloads import (
    EVERY_CHECK,
    PERTURB,
    assert_clean_canary_log,
    fault_has_row,
    faults_and_rows,
    log_when,
    polled_log,
    request,
    tokens,
    union,
)

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=400, suite="kv-canary-gpu")

_WINDOW = 127  # the tiny GPT-OSS's sliding_window_size (its config's sliding_window - 1)
_SERVER_ARGS = ("--moe-runner-backend", "triton", "--max-total-tokens", "4096",
                "--chunked-prefill-size", "512", "--cuda-graph-max-bs", "16")


def _sliding_workload(server, *, seed: int, rounds: int) -> int:
    """Prompts of one to four windows, half of them sharing a two-window prefix, decoding past
    another window; returns the tokens served (prompt + generated)."""
    rng = random.Random(seed)
    shared = tokens(rng, 2 * _WINDOW + 5)
    served = 0
    for round_index in range(rounds):
        payloads = []
        for i in range(6):
            prompt = tokens(rng, rng.randrange(_WINDOW, 4 * _WINDOW))
            if i % 2:
                prompt = shared + prompt[: rng.randrange(1, _WINDOW)]
            new_tokens = rng.choice((8, _WINDOW + 40))
            payloads.append(request(f"r{round_index}-{i}", prompt, new_tokens))
            served += len(prompt) + new_tokens
        server.generate_many(payloads, concurrency=6)
    return served


def _serves_clean(canary_server, model_dir, *args: str) -> None:
    server = canary_server(env=EVERY_CHECK, model_dir=model_dir,
                           args=(*_SERVER_ARGS, "--sampling-backend", "token_oracle", *args))
    served = _sliding_workload(server, seed=3, rounds=5)
    log = polled_log(server)
    assert "pool SWAKVPool" in log and f"window {_WINDOW}" in log
    assert served > 2 * 4096  # more tokens than either sub-pool holds: slots freed and reused
    assert_clean_canary_log(log)


@pytest.mark.gpu
def test_a_sliding_window_model_serves_clean_with_cuda_graphs(canary_server,
                                                               tiny_gpt_oss_dir) -> None:
    _serves_clean(canary_server, tiny_gpt_oss_dir)


@pytest.mark.gpu
def test_a_sliding_window_model_serves_clean_without_graphs_at_page_16(
    canary_server, tiny_gpt_oss_dir,
) -> None:
    _serves_clean(canary_server, tiny_gpt_oss_dir,
                  "--disable-cuda-graph", "--page-size", "16", "--enable-mixed-chunk")


# fault kind -> the reason its rows must carry
_WINDOW_FAULTS = {"window_table": Reason.VERIFY_WINDOW_OWNER,
                  "real_kv_used": Reason.VERIFY_REAL_KV,
                  "real_kv_post_forward": Reason.VERIFY_REAL_KV}
_PERSISTENT = ("real_kv_post_forward", "real_kv_unused_cache")
_FULL_FAULTS = {"req_to_token": Reason.VERIFY_POSITION,
                "real_kv_used": Reason.VERIFY_REAL_KV,
                "real_kv_unused_cache": Reason.VERIFY_REAL_KV}


@pytest.mark.gpu
def test_faults_in_the_sliding_window_sub_pool_are_caught(canary_server,
                                                          tiny_gpt_oss_dir) -> None:
    _faults_are_caught(canary_server, tiny_gpt_oss_dir, sub_pool="window")


@pytest.mark.gpu
def test_faults_in_the_full_attention_sub_pool_are_caught(canary_server,
                                                          tiny_gpt_oss_dir) -> None:
    _faults_are_caught(canary_server, tiny_gpt_oss_dir, sub_pool="full")


def _faults_are_caught(canary_server, model_dir, *, sub_pool: str) -> None:
    """Each fault of ``sub_pool`` is reported with its reason at its step (persistent ones by
    a later check), and no row carries a reason a redirected or flipped slot cannot cause."""
    expected = _WINDOW_FAULTS if sub_pool == "window" else _FULL_FAULTS
    env = {**PERTURB, "SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA": "all",
           "SGLANG_KV_CANARY_PERTURB_KV_SUB_POOL": sub_pool}
    if sub_pool == "window":
        env |= {"SGLANG_KV_CANARY_PERTURB_WINDOW_TABLE_PROB": "0.05",
                "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "0.05",
                "SGLANG_KV_CANARY_PERTURB_REAL_KV_POST_FORWARD_PROB": "0.05"}
    else:
        env |= {"SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.05",
                "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "0.05",
                "SGLANG_KV_CANARY_SWEEP_INTERVAL": "4",
                "SGLANG_KV_CANARY_PERTURB_REAL_KV_UNUSED_CACHE_PROB": "0.05"}
    server = canary_server(env=env, model_dir=model_dir, args=_SERVER_ARGS)
    _sliding_workload(server, seed=5, rounds=3)

    def caught(log: str) -> bool:
        faults, rows = faults_and_rows(log)
        return bool(faults) and all(
            fault_has_row(fault, rows, max_delay=1, reason=int(expected[fault["fault"]]))
            for fault in faults if fault["fault"] not in _PERSISTENT
        )

    faults, rows = faults_and_rows(log_when(server, caught))
    kinds = {fault["fault"] for fault in faults}
    assert kinds == set(expected), f"faults injected: {sorted(kinds)}"
    # a redirected slot: its record, its chain, its owner and its window slot are another's
    allowed = int(Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN | Reason.VERIFY_OWNER
                  | Reason.VERIFY_WINDOW_OWNER | Reason.VERIFY_WINDOW_UNMAPPED
                  | Reason.VERIFY_REAL_KV)
    stray = [row for row in rows if row.reasons & ~allowed]
    assert not stray, "\n".join(row.to_line() for row in stray[:10])
    for fault in faults:
        if fault["fault"] not in _PERSISTENT:
            assert fault_has_row(fault, rows, max_delay=1,
                                 reason=int(expected[fault["fault"]])), fault.group(0)
    if sub_pool == "window":
        # read again by the request's next forward, unless the flip was in its last one
        flips = [f for f in faults if f["fault"] == "real_kv_post_forward"]
        later = [f for f in flips if any(r.position == int(f["position"])
                                         and r.step > int(f["step"]) for r in rows)]
        assert len(later) >= len(flips) // 2, (len(later), len(flips))
    else:
        sweep_rows = [row for row in rows if row.check is CheckKind.SWEEP]
        assert sweep_rows and union(sweep_rows) & int(Reason.VERIFY_REAL_KV)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
