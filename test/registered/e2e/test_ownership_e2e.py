"""End-to-end on a GPU: the ownership check and the detection upgrades in a real server.

1. A request handed another live request's whole prefix (a consistent but foreign history:
   every record verifies against its predecessor) is caught by ``verify_owner`` with the token
   checks and real data OFF, in every forward it is injected, with CUDA graphs.
2. Zero false positives in ``raise`` mode with all checks on: parallel sampling (``n > 1``:
   siblings share the prompt and diverge after it, sampled at temperature 0.8) and batches of
   identical prompts arriving together, with and without CUDA graphs.
"""

import random
import sys

import pytest
from _workloads import (
    PERTURB,
    assert_clean_canary_log,
    assert_every_fault_caught,
    concurrent_traffic,
    every_fault_reported,
    faults_and_rows,
    log_when,
    polled_log,
    request,
    tokens,
)

from sglang.jit_kernel.kv_canary.consts import Reason
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=300, suite="kv-canary-gpu")

_GRAPH_ARGS = ("--page-size", "16", "--chunked-prefill-size", "256", "--max-total-tokens", "8192")
_NO_GRAPH_ARGS = ("--disable-cuda-graph", "--chunked-prefill-size", "128", "--enable-mixed-chunk",
                  "--max-total-tokens", "8192")
_ALL_CHECKS = {
    "SGLANG_KV_CANARY_MODE": "raise",
    "SGLANG_KV_CANARY_REAL_DATA": "partial",
    "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
    "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "25",
    "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS": "25",
}


@pytest.mark.gpu
def test_a_foreign_but_consistent_prefix_is_caught_by_ownership_alone(canary_server) -> None:
    env = {"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA": "none",
           "SGLANG_KV_CANARY_PERTURB_FOREIGN_PREFIX_PROB": "0.2", **PERTURB}
    server = canary_server(env=env, args=_GRAPH_ARGS)
    concurrent_traffic(server, rounds=6)
    server.generate(request("last", tokens(random.Random(1), 30), 8))
    assert server.returncode is None
    faults, rows = faults_and_rows(log_when(server, every_fault_reported))
    # The records the faulted forward wrote were chained from the foreign history: the next
    # forward may also see the chain break at the row's first new position.
    assert_every_fault_caught(
        faults, rows, reason=Reason.VERIFY_OWNER,
        allowed=int(Reason.VERIFY_OWNER | Reason.VERIFY_CHAIN),
    )


def _parallel_and_shared_prompt_traffic(server, *, seed: int) -> int:
    rng = random.Random(seed)
    sent = 0
    for group in range(6):
        prompt = tokens(rng, rng.choice([15, 16, 17, 100, 300]))
        outputs = server.generate({
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0.8, "n": 4,
                                "ignore_eos": True},
        })
        assert len(outputs) == 4
        sent += 4
    for group in range(4):
        prompt = tokens(rng, rng.choice([31, 32, 33, 250]))
        same = [request(f"same-{group}-{i}", prompt, 16, temperature=0.8) for i in range(8)]
        server.generate_many(same, concurrency=8)
        sent += len(same)
    return sent


@pytest.mark.gpu
@pytest.mark.parametrize("args", [_GRAPH_ARGS, _NO_GRAPH_ARGS], ids=["graphs", "no-graphs"])
def test_parallel_sampling_and_shared_prompts_have_no_violation(canary_server, args) -> None:
    server = canary_server(env=_ALL_CHECKS, args=args)
    assert _parallel_and_shared_prompt_traffic(server, seed=3) >= 50
    assert server.returncode is None
    assert_clean_canary_log(polled_log(server), min_health_checks=1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
