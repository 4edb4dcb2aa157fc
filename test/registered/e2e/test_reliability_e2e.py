"""End-to-end on a GPU: the canary's promises about reporting and bad client input (its memory
budget is checked in ``test_startup_e2e.py``, on servers that run alone on the GPU).

1. Log mode keeps reporting: a persistent stream of violations (SGLang's padded-row bug
   re-injected) for many forwards does not stop a later, different violation from being
   printed.
2. A client's invalid ``bootstrap_room`` (negative) with the token oracle on is answered and
   the server keeps serving (it falls back to the request's rid, with a warning).
"""

import random
import sys

import pytest
from _workloads import PERTURB, concurrent_traffic, faults_and_rows, request, tokens

from sglang.jit_kernel.kv_canary.consts import Reason
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=300, suite="kv-canary-gpu")


@pytest.mark.gpu
def test_log_mode_keeps_reporting_after_a_long_persistent_fault(canary_server) -> None:
    env = {"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REINJECT_PADDED_ROW_BUG": "1",
           "SGLANG_KV_CANARY_RING_CAPACITY": "16", **PERTURB,
           "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": "1500",
           "SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.05"}
    server = canary_server(env=env, args=("--cuda-graph-max-bs", "8"))
    rng = random.Random(8)
    # 8 long requests, then 5 concurrently for many steps: every step replays the bs-8 graph
    # with 3 stale padded rows (3 padded_row rows per forward, a 16-row ring).
    server.generate_many([request(f"full-{i}", tokens(rng, 30), 8) for i in range(8)],
                         concurrency=8)
    server.generate_many([request(f"long-{i}", tokens(rng, 30), 1600) for i in range(5)],
                         concurrency=5)
    concurrent_traffic(server, rounds=3, per_round=5, new_tokens=40)
    log = server.log_text()
    faults, rows = faults_and_rows(log)
    assert any(r.reasons & int(Reason.PADDED_ROW) for r in rows)
    assert faults, "the second fault was never injected"
    # a redirected slot belongs to another request: its chain (or position) differs
    late = [r for r in rows
            if r.reasons & int(Reason.VERIFY_CHAIN | Reason.VERIFY_POSITION)]
    assert late, "a new, different violation after the persistent one was not printed"
    assert "kv_canary violation repeats:" in log


@pytest.mark.gpu
def test_an_invalid_client_bootstrap_room_does_not_take_the_server_down(canary_server) -> None:
    env = {"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"}
    server = canary_server(env=env, args=("--sampling-backend", "token_oracle"))
    payload = {**request("bad-room", tokens(random.Random(9), 20), 8), "bootstrap_room": -5}
    try:
        server.generate(payload)
    except Exception:  # noqa: BLE001 - SGLang itself may refuse the field: that is fine too
        pass
    after = server.generate(request("after", tokens(random.Random(10), 20), 8))
    assert after["meta_info"]["completion_tokens"] == 8
    assert server.returncode is None
    # SGLang's own start-up warning (no openai_harmony in the GPU bundle) is not the request's
    tracebacks = [line for line in server.log_text().splitlines() if "Traceback" in line
                  and "Can not initialize OpenAIServingResponses" not in line]
    assert tracebacks == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
