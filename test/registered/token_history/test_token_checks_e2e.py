"""End-to-end on a GPU: verify-token and the write-input assert inside a real
``python -m sglang.launch_server`` on the tiny dummy-weight model (fixtures from
``e2e_fixtures.py``: ``canary_server(env=, args=)``).

1. Both token checks on, the token oracle steering every token, the detection tests' clean mixed
   workload (page/chunk boundaries +-1, shared prefixes A -> B -> A, padded graph batches,
   eviction, aborts), once with CUDA graphs, once without graphs with mixed chunks: zero
   violations; verify-token alone with the plain pytorch sampler at temperature 0.8 (histories
   a real model would produce): zero violations.
2. next_token_swap at p=1: ``write_token`` violations at the swapped positions, and no KV-side
   reason (chain, position, real data, verify_token): the KV cache and the histories stay
   consistent with the swapped tokens.
3. ``input_ids`` perturbation: every fault is reported by ``write_token`` in its own forward and
   later by ``verify_token``, nothing else fires; with CUDA graphs (decode faults land in
   replayed graphs: the decode batches fit the captured sizes) and without.
"""

import random
import sys
from pathlib import Path

import pytest

from sglang.jit_kernel.kv_canary.consts import CheckKind, Reason
from sglang.srt.kv_canary.perturb.fault import PERTURB_LINE_RE
from sglang.srt.kv_canary.monitor.violation_reporter import RING_OVERFLOW_PREFIX
from sglang.srt.kv_canary.monitor.violations import find_violation_rows
from sglang.test.ci.ci_register import register_cuda_ci

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from _workloads import polled_log  # noqa: E402
from test_detection_e2e import (  # noqa: E402 - the detection workload and clean-log checks
    _CHUNK,
    _GRAPH_ARGS,
    _NO_GRAPH_ARGS,
    _PAGE,
    _assert_clean_canary_log,
    _run_mixed_workload,
)

register_cuda_ci(est_time=420, suite="kv-canary-gpu")

_FIRST_TOKEN_ID, _VOCAB = 5, 4096  # the tiny model's ordinary token ids
_ORACLE_ARGS = ("--sampling-backend", "token_oracle")
_CANARY = {
    "SGLANG_KV_CANARY_MODE": "log",
    "SGLANG_KV_CANARY_REAL_DATA": "partial",
    "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": "25",
    "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS": "25",
}
_TOKEN_CHECKS = {
    **_CANARY,
    "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1",
    "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1",
    "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
}
_PERTURB = {
    "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": "20",
    "SGLANG_KV_CANARY_PERTURB_SEED": "7",
    # A wrong token stays in the KV cache: every later forward of its request reports it again.
    "SGLANG_KV_CANARY_RING_CAPACITY": "100000",
}
_TOKEN_REASONS = int(Reason.WRITE_TOKEN | Reason.VERIFY_TOKEN)
_INSTALLED = "token checks: verify_token on, write_input_assert on (oracle;"


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(_FIRST_TOKEN_ID, _VOCAB) for _ in range(n)]


def _request(rid: str, prompt: list[int], max_new_tokens: int, *,
             temperature: float = 0.0) -> dict:
    return {
        "rid": rid,
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature,
                            "ignore_eos": True},
    }


def _flush_reports(server) -> str:
    """The log once the canary reported every forward (:func:`_workloads.polled_log`)."""
    assert server.returncode is None
    log = polled_log(server)
    assert RING_OVERFLOW_PREFIX not in log
    return log


# ----------------------------------------------------------------------------- 1. clean


def _write_token_diagnosis(rows) -> str:
    """For ``write_token`` rows of an EXTEND-layout forward (checked after the model): which
    have a ``verify_token`` row of the same slot in the same forward's post launch (the record,
    written from ``input_ids`` before the model, holds the wrong token too: the model was fed
    it) and which have none (``input_ids`` changed while the model ran)."""
    verify = {(r.slot, r.step) for r in rows
              if r.reasons & int(Reason.VERIFY_TOKEN) and r.check is CheckKind.POST_VERIFY}
    written = [r for r in rows if r.reasons & int(Reason.WRITE_TOKEN)]
    fed = [r for r in written if (r.slot, r.step) in verify]
    return (f"{len(written)} write_token rows: {len(fed)} with a verify_token of their slot in "
            f"their forward (the model was fed the stored token), {len(written) - len(fed)} "
            "without (input_ids changed during the forward); first: "
            + "; ".join(r.to_line() for r in written[:3]))


_MIXED_CHUNK_ARGS = ("--page-size", str(_PAGE), "--chunked-prefill-size", str(_CHUNK),
                     "--enable-mixed-chunk", "--max-total-tokens", "6144")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "args, page, chunk",
    [(_GRAPH_ARGS, _PAGE, _CHUNK), (_NO_GRAPH_ARGS, 1, 128), (_MIXED_CHUNK_ARGS, _PAGE, _CHUNK)],
    ids=["cuda-graphs", "no-graphs-mixed-chunk", "cuda-graphs-mixed-chunk"],
)
def test_clean_workload_with_both_token_checks_has_no_violation(canary_server, args, page,
                                                                 chunk) -> None:
    """Overlap scheduling on in each; with mixed chunk, the decode rows of a MIXED batch are
    futures until the forward stream resolves them."""
    server = canary_server(env=_TOKEN_CHECKS, args=(*_ORACLE_ARGS, *args))
    assert _run_mixed_workload(server, page=page, chunk=chunk, seed=5) >= 200
    log = _flush_reports(server)
    assert _INSTALLED in log
    rows = find_violation_rows(log)
    assert not any(r.reasons & int(Reason.WRITE_TOKEN) for r in rows), (
        _write_token_diagnosis(rows))
    _assert_clean_canary_log(log)


@pytest.mark.gpu
def test_clean_sampled_workload_with_verify_token_has_no_violation(canary_server) -> None:
    """The pytorch sampler at temperature 0.8: histories are whatever the model samples."""
    env = {**_CANARY, "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1"}
    server = canary_server(env=env, args=_GRAPH_ARGS)
    rng = random.Random(9)
    shared = _tokens(rng, 3 * _PAGE + 5)
    payloads = [
        _request(f"sampled-{i}", (shared if i % 3 == 0 else []) + _tokens(rng, n), m,
                 temperature=0.8)
        for i, (n, m) in enumerate(
            (rng.choice([1, _PAGE - 1, _PAGE + 1, _CHUNK - 1, _CHUNK + 1, 400]),
             rng.randrange(4, 48)) for _ in range(60))
    ]
    outputs = server.generate_many(payloads, concurrency=12)
    assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outputs)
    log = _flush_reports(server)
    assert "token checks: verify_token on, write_input_assert off" in log
    _assert_clean_canary_log(log)


# ----------------------------------------------------------------------------- 2. next_token_swap


@pytest.mark.gpu
def test_next_token_swap_is_reported_by_write_token_only(canary_server) -> None:
    env = {**_TOKEN_CHECKS, **_PERTURB, "SGLANG_KV_CANARY_PERTURB_NEXT_TOKEN_SWAP_PROB": "1"}
    server = canary_server(env=env, args=(*_ORACLE_ARGS, *_GRAPH_ARGS))
    rng = random.Random(3)
    for wave in range(3):
        server.generate_many([_request(f"swap-{wave}-{i}", _tokens(rng, rng.randrange(8, 120)),
                                       24) for i in range(6)], concurrency=6)
    log = _flush_reports(server)
    swaps = [m for m in map(PERTURB_LINE_RE.search, log.splitlines())
             if m and m["fault"] == "next_token_swap"]
    rows = find_violation_rows(log)
    assert swaps, "no swap was injected"
    stray = [r for r in rows if r.reasons != Reason.WRITE_TOKEN or r.check != CheckKind.WRITE]
    assert not stray, "\n".join(r.to_line() for r in stray[:10])
    swapped_positions = {int(m["position"]) for m in swaps}
    swapped_positions |= {int(value) for m in swaps
                          for key, value in [pair.split("=") for pair in m["detail"].split()]
                          if key == "partner_position"}
    assert rows and {r.position for r in rows} <= swapped_positions


# ----------------------------------------------------------------------------- 3. input_ids


def _perturbation_workload(server, *, seed: int) -> dict[str, tuple[int, int]]:
    """Concurrent decoding requests with distinct prompts; rid -> (prompt length, new tokens)."""
    rng = random.Random(seed)
    requests = {}
    for wave in range(4):
        payloads = []
        for i in range(8):
            rid, length, new_tokens = f"in-{wave}-{i}", rng.randrange(10, 200), 24
            requests[rid] = (length, new_tokens)
            payloads.append(_request(rid, _tokens(rng, length), new_tokens))
        server.generate_many(payloads, concurrency=8)
    return requests


def _assert_input_ids_faults_caught(log: str, requests: dict[str, tuple[int, int]]) -> None:
    faults = [m for m in map(PERTURB_LINE_RE.search, log.splitlines())
              if m and m["fault"] == "input_ids"]
    rows = find_violation_rows(log)
    assert faults, "no fault was injected"
    stray = [r for r in rows if r.reasons & ~_TOKEN_REASONS]
    assert not stray, "\n".join(r.to_line() for r in stray[:10])

    def caught(fault, *, check_kinds, reason, later: bool) -> bool:
        step, position = int(fault["step"]), int(fault["position"])
        return any(r.position == position and r.check in check_kinds and r.reasons & reason
                   and (r.step > step if later else r.step == step) for r in rows)

    verify_kinds = (CheckKind.PRE_VERIFY, CheckKind.POST_VERIFY)
    decode_faults_verified_later = 0
    for fault in faults:
        assert caught(fault, check_kinds=(CheckKind.WRITE,), reason=Reason.WRITE_TOKEN,
                      later=False), fault.group(0)
        prompt_len, new_tokens = requests.get(fault["rid"], (None, None))
        if prompt_len is None:
            continue
        position = int(fault["position"])
        if prompt_len <= position < prompt_len + new_tokens - 2:  # decoded, then read again
            assert caught(fault, check_kinds=verify_kinds, reason=Reason.VERIFY_TOKEN,
                          later=True), fault.group(0)
            decode_faults_verified_later += 1
    assert decode_faults_verified_later > 0, "no decode fault was read again afterwards"


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["cuda-graphs", "no-graphs"])
def test_input_ids_faults_are_caught_by_the_token_checks_only(canary_server, graphs) -> None:
    env = {**_TOKEN_CHECKS, **_PERTURB, "SGLANG_KV_CANARY_PERTURB_INPUT_IDS_PROB": "0.1"}
    args = (*_ORACLE_ARGS, "--decode-log-interval", "1")
    if not graphs:
        args += ("--disable-cuda-graph",)
    server = canary_server(env=env, args=args)
    requests = _perturbation_workload(server, seed=11 if graphs else 12)
    log = _flush_reports(server)
    _assert_input_ids_faults_caught(log, requests)
    decode_lines = [line for line in log.splitlines() if "Decode batch" in line]
    assert decode_lines and all(("cuda graph: True" in line) == graphs for line in decode_lines)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
