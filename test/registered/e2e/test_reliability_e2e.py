"""End-to-end on a GPU: the canary's promises about memory, reporting and bad client input.

1. Memory budget: the canary's fixed buffers are reserved from the profiled KV budget and its
   records add 32 B to every token's cell, so the KV pool of a canary server holds
   ``(available - reserved) // (cell + 32)`` tokens where a server without the canary holds
   ``available // cell``; every buffer the canary allocated fits its reservation.
2. Log mode keeps reporting: a persistent stream of violations (SGLang's padded-row bug
   re-injected) for many forwards does not stop a later, different violation from being
   printed.
3. A client's invalid ``bootstrap_room`` (negative) with the token oracle on is answered and
   the server keeps serving (it falls back to the request's rid, with a warning).
"""

import random
import re
import sys

import pytest
from _workloads import PERTURB, concurrent_traffic, faults_and_rows, request, tokens

from sglang.jit_kernel.kv_canary.consts import RECORD_BYTES, Reason
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=300, suite="kv-canary-gpu")

# The tiny model (tools/tiny_model.py): 4 layers, 2 KV heads of 64 bf16 values, K and V.
_CELL_BYTES = 4 * 2 * 2 * 64 * 2
_NO_TOKEN_CAP = ("--max-total-tokens", "1000000000")  # above the profile: SGLang uses the profile
_BUDGET_RE = re.compile(r"KV canary memory budget: (\d+) B profiled for the KV pool, (\d+) B "
                        r"reserved")
_DEVICE_RE = re.compile(r"KV canary device memory: (\d+) B allocated = records (\d+) B .*?"
                        r"fixed buffers (\d+) B \(reserved (\d+) B")
_TOKENS_RE = re.compile(r"max_total_num_tokens=(\d+)")


def _max_total_tokens(log: str) -> int:
    return int(_TOKENS_RE.findall(log)[-1])


@pytest.mark.gpu
def test_kv_pool_shrinks_by_the_documented_amount(canary_server) -> None:
    off = canary_server(args=_NO_TOKEN_CAP)
    tokens_off = _max_total_tokens(off.log_text())
    off.stop()
    on = canary_server(env={"SGLANG_KV_CANARY_MODE": "log"}, args=_NO_TOKEN_CAP)
    log = on.log_text()
    available, reserved = map(int, _BUDGET_RE.search(log).groups())
    tokens_on = _max_total_tokens(log)
    # the canary server's own arithmetic, exactly (pages of 1 token)
    assert tokens_on == (available - reserved) // (_CELL_BYTES + RECORD_BYTES), log[-2000:]
    # against the server without the canary (its profile differs by at most a few MB)
    assert abs(tokens_off - available // _CELL_BYTES) <= 0.002 * tokens_off
    allocated, records, fixed, reserved_logged = map(int, _DEVICE_RE.search(log).groups())
    assert reserved_logged == reserved and fixed <= reserved
    assert records == (tokens_on + 1) * RECORD_BYTES  # one record per slot, padding slot 0 too
    assert allocated == records + fixed


@pytest.mark.gpu
def test_log_mode_keeps_reporting_after_a_long_persistent_fault(canary_server) -> None:
    env = {"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REINJECT_PADDED_ROW_BUG": "1",
           "SGLANG_KV_CANARY_RING_CAPACITY": "16", **PERTURB,
           "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": "1500",
           "SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.05"}
    server = canary_server(env=env, args=("--cuda-graph-max-bs", "8"))
    rng = random.Random(8)
    # 8 long requests, then 5 concurrently for many steps: every step replays the bs-8 graph
    # with 3 stale padded rows (3 write_unmapped rows per forward, a 16-row ring).
    server.generate_many([request(f"full-{i}", tokens(rng, 30), 8) for i in range(8)],
                         concurrency=8)
    server.generate_many([request(f"long-{i}", tokens(rng, 30), 1600) for i in range(5)],
                         concurrency=5)
    concurrent_traffic(server, rounds=3, per_round=5, new_tokens=40)
    log = server.log_text()
    faults, rows = faults_and_rows(log)
    assert any(r.reasons & int(Reason.WRITE_UNMAPPED) for r in rows)
    assert faults, "the second fault was never injected"
    late = [r for r in rows if r.reasons & int(Reason.VERIFY_POSITION)]
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
