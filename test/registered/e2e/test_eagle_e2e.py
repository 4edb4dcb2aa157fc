"""End-to-end on a GPU: the canary under EAGLE speculative decoding (spec v2, overlap on, topk
1) inside a real ``python -m sglang.launch_server`` on the tiny dummy-weight model and its tiny
EAGLE draft (fixtures from ``e2e_fixtures.py``).

Two canaries run in the scheduler: the target model's (prefill, TARGET_VERIFY) and the draft
model's (draft extend after prefill, the draft decode steps, DRAFT_EXTEND_V2), each on its own
pool; the draft's lines end with ``pool=draft``.

1. A clean workload with every check on (token oracle, write-input assert, verify-token, real
   data, the radix sweep of the target pool), with and without CUDA graphs: zero violations
   from either canary, health checks passing on both, the draft graphs replayed.
2. SGLang's simulated acceptance (``SGLANG_SIMULATE_ACC_LEN``): verifications keep 1 to
   ``num_steps + 1`` tokens, so the owner chains follow multi-token acceptances; zero
   violations (token checks off: the simulation emits token 100 for what the KV holds as the
   draft's tokens, a mismatch the verify-token check would rightly report).
3. ``req_to_token`` perturbation with EAGLE on: every fault is reported by the target canary.
4. A real SGLang 0.5.12 bug: EAGLE with chunked prefill writes a wrong draft token at each chunk
   boundary; the draft canary reports exactly those positions.
5. ``REINJECT_PADDED_ROW_BUG=1``: the draft-extend graph runner's stale padded rows (0.5.12
   leaves them, as in its decode runner) are reported by the draft canary.
6. The radix sweep walks EAGLE's bigram-keyed tree: a byte flipped in an unused cached slot is
   reported by ``check=sweep``.
"""

import random
import re
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

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.srt.kv_canary.monitor.health import HEALTH_OK_PREFIX
from sglang.srt.kv_canary.monitor.violations import find_violation_rows
from sglang.srt.kv_canary.runner.components import DRAFT_LINE_SUFFIX
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=600, suite="kv-canary-gpu")

_STEPS = 3
_EAGLE_ARGS = (
    "--speculative-algorithm", "EAGLE",
    "--speculative-num-steps", str(_STEPS), "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", str(_STEPS + 1),
    "--cuda-graph-max-bs", "16",
)
# No prefill is chunked (every prefill batch of the workloads fits): SGLang 0.5.12's EAGLE
# writes a wrong draft token at each chunk boundary (test 4).
_UNCHUNKED = ("--chunked-prefill-size", "8192", "--max-total-tokens", "32768")
_ALL_CHECKS = {
    "SGLANG_KV_CANARY_MODE": "raise",
    "SGLANG_KV_CANARY_REAL_DATA": "partial",
    "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1",
    "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
    "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1",
    "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "25",
    "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS": "25",
    "SGLANG_KV_CANARY_SWEEP_INTERVAL": "8",
}
_ORACLE_ARGS = ("--sampling-backend", "token_oracle")
# A redirected prefix entry: its slot's record describes another position, history and token.
_REDIRECT_REASONS = int(Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN | Reason.VERIFY_OWNER
                        | Reason.VERIFY_TOKEN)


def _eagle(draft_dir, *extra: str) -> tuple[str, ...]:
    return (*_EAGLE_ARGS, "--speculative-draft-model-path", str(draft_dir), *extra)


def _eagle_unchunked(draft_dir, *extra: str) -> tuple[str, ...]:
    return _eagle(draft_dir, *_UNCHUNKED, *extra)


def _workload(server, *, seed: int) -> int:
    """Prompts of many lengths, shared prefixes (radix reuse of both pools), concurrent batches
    of odd sizes (padded graph replays), long decodes; returns the requests sent."""
    rng = random.Random(seed)
    outputs = server.generate_many(
        [request(f"len-{i}", tokens(rng, n), rng.randrange(4, 40))
         for i, n in enumerate((1, 2, 3, 15, 16, 17, 63, 64, 65, 255, 256, 257, 700))],
        concurrency=5,
    )
    for group in range(6):
        shared = tokens(rng, rng.choice([7, 31, 130]))
        for name in ("a", "b", "a2"):
            suffix = tokens(random.Random(f"{group}-{name[0]}"), 9)
            outputs.append(server.generate(request(f"shared-{group}-{name}", shared + suffix,
                                                   12)))
    outputs += server.generate_many(
        [request(f"bulk-{i}", tokens(rng, rng.randrange(5, 300)), rng.randrange(8, 64))
         for i in range(40)],
        concurrency=11,
    )
    for output in outputs:
        assert output["meta_info"]["finish_reason"]["type"] == "length", output["meta_info"]
    return len(outputs)


def _assert_both_canaries_clean(log: str) -> None:
    assert_clean_canary_log(log)
    assert "KV canary installed on the EAGLE draft model's pool" in log
    lines = log.splitlines()
    draft_health = [line for line in lines if HEALTH_OK_PREFIX in line
                    and line.endswith(DRAFT_LINE_SUFFIX)]
    target_health = [line for line in lines if HEALTH_OK_PREFIX in line
                     and not line.endswith(DRAFT_LINE_SUFFIX)]
    assert len(draft_health) >= 2 and len(target_health) >= 2, (draft_health, target_health)
    assert "canary path is not executing" not in log


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["cuda-graphs", "eager"])
def test_clean_eagle_workload_has_no_violation(canary_server, tiny_eagle_draft_dir,
                                               graphs: bool) -> None:
    extra = () if graphs else ("--disable-cuda-graph",)
    server = canary_server(env=_ALL_CHECKS,
                           args=(*_ORACLE_ARGS, *_eagle_unchunked(tiny_eagle_draft_dir, *extra)))
    log = server.log_text()
    assert "Spec v2 is enabled" in log
    assert _workload(server, seed=3 if graphs else 4) >= 70
    assert server.returncode is None
    _assert_both_canaries_clean(polled_log(server))


_ACCEPT_LEN = re.compile(r"accept len: (?P<value>[0-9.]+)")


@pytest.mark.gpu
def test_multi_token_acceptance_keeps_the_owner_chains(canary_server,
                                                       tiny_eagle_draft_dir) -> None:
    env = {
        "SGLANG_KV_CANARY_MODE": "raise",
        "SGLANG_KV_CANARY_REAL_DATA": "partial",
        "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS": "25",
        "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "25",
        "SGLANG_SIMULATE_ACC_LEN": "2.5",
    }
    server = canary_server(env=env, args=_eagle_unchunked(tiny_eagle_draft_dir))
    assert _workload(server, seed=5) >= 70
    log = polled_log(server)
    assert server.returncode is None
    accepted = [float(m["value"]) for m in _ACCEPT_LEN.finditer(log)]
    assert accepted and max(accepted) > 1.5, accepted[-10:]
    _assert_both_canaries_clean(log)


@pytest.mark.gpu
def test_req_to_token_fault_is_caught_with_eagle(canary_server, tiny_eagle_draft_dir) -> None:
    env = {**_ALL_CHECKS, **PERTURB, "SGLANG_KV_CANARY_MODE": "log",
           "SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.2"}
    server = canary_server(env=env,
                           args=(*_ORACLE_ARGS, *_eagle_unchunked(tiny_eagle_draft_dir)))
    concurrent_traffic(server, rounds=6)
    server.generate(request("last", tokens(random.Random(1), 30), 8))
    assert server.returncode is None
    log = log_when(server, every_fault_reported)
    faults, rows = faults_and_rows(log)
    assert not [line for line in log.splitlines()
                if "kv_canary violation:" in line and line.endswith(DRAFT_LINE_SUFFIX)]
    # Log mode serves on: a verify forward that read a redirected last prefix slot writes its
    # new slots' K/V (and records) from that foreign context. Those slots stay in the radix
    # cache, and the sweep reports their chains again on every pass: only slots the verify
    # checks reported, only as chain mismatches.
    verify_rows = [r for r in rows if r.check is not CheckKind.SWEEP]
    reported_slots = {r.slot for r in verify_rows}
    assert all(r.slot in reported_slots and r.reasons == int(Reason.VERIFY_CHAIN)
               for r in rows if r.check is CheckKind.SWEEP)
    assert_every_fault_caught(faults, verify_rows, reason=Reason.VERIFY_POSITION,
                              allowed=_REDIRECT_REASONS)


@pytest.mark.gpu
def test_the_sweep_reports_a_flipped_byte_in_an_unused_cached_slot_with_eagle(
    canary_server, tiny_eagle_draft_dir,
) -> None:
    """EAGLE keys the radix tree by bigrams; the target canary's sweep walks it and reports a
    byte flipped in a cached slot no running request uses."""
    env = {"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA": "partial", **PERTURB,
           "SGLANG_KV_CANARY_SWEEP_INTERVAL": "4",
           "SGLANG_KV_CANARY_PERTURB_REAL_KV_UNUSED_CACHE_PROB": "0.5"}
    server = canary_server(env=env, args=_eagle_unchunked(tiny_eagle_draft_dir))
    rng = random.Random(4)
    for index in range(40):  # distinct prompts, one at a time: unlocked cached prefixes
        server.generate(request(f"d-{index}", tokens(rng, rng.randrange(40, 300)), 8))
    log = server.log_text()
    faults, rows = faults_and_rows(log)
    assert faults, log[-3000:]
    sweep_rows = [r for r in rows if r.check is CheckKind.SWEEP]
    # A second flip of a slot's row may hit the byte the first flipped and restore it: each
    # slot row's first fault is the one that must be caught.
    first_faults = {(f["position"], f["detail"]): f for f in reversed(faults)}  # node, buffer
    for fault in first_faults.values():  # caught by the pass the fault was injected before
        assert any(r.step == int(fault["step"]) and r.position == int(fault["position"])
                   and r.reasons & int(Reason.VERIFY_REAL_KV) for r in sweep_rows), fault.group(0)
    assert all(r.reasons == int(Reason.VERIFY_REAL_KV) for r in rows)


@pytest.mark.gpu
def test_the_draft_token_sglang_writes_at_a_chunk_boundary_is_reported(
    canary_server, tiny_eagle_draft_dir,
) -> None:
    """SGLang 0.5.12's EAGLE draft extend after a prefill chunk writes, at the chunk's last
    position ``e - 1``, the target's sample after the chunk instead of the prompt's token ``e``
    (the draft slot ``p`` must hold the token of ``p + 1``; fixed upstream after 0.5.12). The
    draft canary's verify-token check reports exactly those positions, from the draft pool; the
    target's pool stays clean."""
    chunk = 64
    env = {**_ALL_CHECKS, "SGLANG_KV_CANARY_MODE": "log"}
    server = canary_server(env=env, args=(
        *_ORACLE_ARGS, *_eagle(tiny_eagle_draft_dir, "--chunked-prefill-size", str(chunk),
                               "--max-total-tokens", "32768"),
    ))
    prompt = tokens(random.Random(9), 3 * chunk + 20)
    server.generate(request("chunked", prompt, 16))
    server.generate(request("after", tokens(random.Random(10), 12), 16))  # flush the reports
    log = server.log_text()
    assert server.returncode is None
    draft_rows = [row for line in log.splitlines() if line.endswith(DRAFT_LINE_SUFFIX)
                  for row in find_violation_rows(line)]
    target_rows = [row for line in log.splitlines() if not line.endswith(DRAFT_LINE_SUFFIX)
                   for row in find_violation_rows(line)]
    assert target_rows == [], target_rows[:5]
    boundaries = {k * chunk - 1 for k in (1, 2, 3)}
    assert {row.position for row in draft_rows} == boundaries, draft_rows[:10]
    assert all(row.reasons == int(Reason.VERIFY_TOKEN) for row in draft_rows)
    assert all(row.expected_token == prompt[row.position + 1] for row in draft_rows)


@pytest.mark.gpu
def test_the_draft_extend_runner_s_stale_padded_rows_are_reported_when_reinjected(
    canary_server, tiny_eagle_draft_dir,
) -> None:
    """SGLang 0.5.12's EAGLE draft-extend graph runner leaves the request rows of an earlier,
    larger batch in the padded rows of a replay, as its decode runner does. With
    ``REINJECT_PADDED_ROW_BUG=1`` the canary does not point them at row 0, and the draft canary
    reports each such row, a request row past the batch's live rows (``padded_row``,
    ``pool=draft``)."""
    env = {"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REINJECT_PADDED_ROW_BUG": "1"}
    server = canary_server(env=env, args=_eagle_unchunked(tiny_eagle_draft_dir))
    rng = random.Random(6)
    # 16 rows fill the bs-16 graphs; then 13 rows replay the bs-14 ones (with EAGLE SGLang
    # captures 1..8, 10, 12, 14, 16): row 13 keeps an index of the earlier batch.
    server.generate_many([request(f"full-{i}", tokens(rng, 40), 40) for i in range(16)],
                         concurrency=16)
    server.generate_many([request(f"part-{i}", tokens(rng, 40), 40) for i in range(13)],
                         concurrency=13)
    log = server.log_text()
    assert "padded_row_fix=OFF" in log
    draft_rows = [row for line in log.splitlines() if line.endswith(DRAFT_LINE_SUFFIX)
                  for row in find_violation_rows(line)]
    padded = [row for row in draft_rows if row.reasons & int(Reason.PADDED_ROW)]
    assert padded, log[-3000:]
    assert all(row.req_pool_idx != 0 for row in padded)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
