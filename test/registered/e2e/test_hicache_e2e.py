"""End-to-end on a GPU: the canary over SGLang's hierarchical cache (``--enable-hierarchical-cache``,
``HiRadixCache`` with ``MHATokenToKVPoolHost`` or ``MLATokenToKVPoolHost``): the records follow KV pages to the host tier
and back into new device slots.

A small device pool (2048 tokens) and a host pool four times larger; six 600-token prefixes
served round after round, so each round pushes the earlier prefixes out of the device pool and
loads them back from the host (SGLang's ``meta_info.cached_tokens_details.host`` counts the
tokens served from the host tier).

1. Clean runs in ``raise`` mode with every check (real data, sweep, token oracle, write-input and
   verify-token asserts), CUDA graphs and the overlap schedule on: write-through at page size 1
   with ``partial`` real data, write-back at page size 16 with ``all``, and the tiny DeepSeek-V2
   (``MLATokenToKVPoolHost``); zero violations.
2. Faults in log mode, drawn per load-back: ``real_kv_host`` (a byte flipped in each 16-byte
   window of one fingerprinted row of a host copy) is reported at the load-back forward as
   ``verify_real_kv_hash``; ``load_shift`` (a load copied one page over) as ``verify_position``.
"""

import random
import sys

import pytest

from _workloads import (
    EVERY_CHECK,
    PERTURB,
    assert_clean_canary_log,
    log_when,
    polled_log,
    request,
    tokens,
)

from sglang.jit_kernel.kv_canary.consts import Reason
from sglang.srt.kv_canary.monitor.violations import find_violation_rows
from sglang.srt.kv_canary.perturb.host_tier import HOST_FAULT_LINE_RE
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=400, suite="kv-canary-gpu")

_DEVICE_TOKENS = 2048
_SERVER_ARGS = ("--max-total-tokens", str(_DEVICE_TOKENS), "--chunked-prefill-size", "512",
                "--cuda-graph-max-bs", "16", "--enable-hierarchical-cache", "--hicache-ratio", "4")
_PREFIXES, _PREFIX_TOKENS = 6, 600
# fault kind -> the reason its rows must carry at the load-back forward
_FAULTS = {"real_kv_host": Reason.VERIFY_REAL_KV, "load_shift": Reason.VERIFY_POSITION}
# a page of another position: its record's position, chain and owner; changed bytes: the
# fingerprint
_ALLOWED = int(Reason.VERIFY_POSITION | Reason.VERIFY_CHAIN | Reason.VERIFY_OWNER
               | Reason.VERIFY_REAL_KV)


def _workload(server, *, seed: int, rounds: int) -> list[dict]:
    """Rounds of the six prefixes, each with a fresh suffix, two requests in flight; returns
    every output."""
    rng = random.Random(seed)
    prefixes = [tokens(rng, _PREFIX_TOKENS) for _ in range(_PREFIXES)]
    outputs = []
    for round_index in range(rounds):
        payloads = [request(f"h{round_index}-{i}", prefix + tokens(rng, rng.randrange(4, 40)),
                            rng.choice((4, 24)))
                    for i, prefix in enumerate(prefixes)]
        outputs += server.generate_many(payloads, concurrency=2)
    return outputs


def _host_tokens(outputs: list[dict]) -> int:
    """Prompt tokens SGLang served from the host tier (loaded back into the device pool)."""
    return sum((output["meta_info"].get("cached_tokens_details") or {}).get("host", 0)
               for output in outputs)


def _serves_clean(canary_server, *, env: dict[str, str], args: tuple[str, ...],
                  model_dir=None) -> None:
    server = canary_server(env=env, model_dir=model_dir,
                           args=(*_SERVER_ARGS, "--sampling-backend", "token_oracle", *args))
    outputs = _workload(server, seed=3, rounds=4)
    log = polled_log(server)
    assert "KV canary host tier: records for the" in log
    # rounds 2..4 find most prefixes on the host only: several thousand tokens loaded back
    assert _host_tokens(outputs) >= 4 * _PREFIX_TOKENS, _host_tokens(outputs)
    assert_clean_canary_log(log)


@pytest.mark.gpu
def test_a_host_tier_workload_serves_clean_with_write_through_at_page_1(canary_server) -> None:
    _serves_clean(canary_server, env=EVERY_CHECK, args=())


@pytest.mark.gpu
def test_a_host_tier_workload_serves_clean_with_write_back_at_page_16(canary_server) -> None:
    _serves_clean(canary_server, env={**EVERY_CHECK, "SGLANG_KV_CANARY_REAL_DATA": "all"},
                  args=("--page-size", "16", "--hicache-write-policy", "write_back"))


@pytest.mark.gpu
def test_an_mla_model_s_host_tier_serves_clean(canary_server, tiny_deepseek_dir) -> None:
    _serves_clean(canary_server, env=EVERY_CHECK, args=(), model_dir=tiny_deepseek_dir)


@pytest.mark.gpu
def test_host_tier_faults_are_caught_at_the_load_back_forward(canary_server) -> None:
    env = {**PERTURB, "SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA": "partial",
           "SGLANG_KV_CANARY_PERTURB_REAL_KV_HOST_PROB": "0.25",
           "SGLANG_KV_CANARY_PERTURB_LOAD_SHIFT_PROB": "0.25"}
    server = canary_server(env=env, args=_SERVER_ARGS)
    outputs = _workload(server, seed=5, rounds=5)
    assert server.returncode is None  # log mode serves on
    assert _host_tokens(outputs) > 0

    def faults(log: str) -> list:
        return [m for m in map(HOST_FAULT_LINE_RE.search, log.splitlines()) if m]

    def caught_at(fault, rows) -> bool:
        step = int(fault["step"])
        return any(row.step == step and row.reasons & _FAULTS[fault["fault"]] for row in rows)

    def all_caught(log: str) -> bool:
        rows = find_violation_rows(log)
        return bool(faults(log)) and all(caught_at(fault, rows) for fault in faults(log))

    log = log_when(server, all_caught)
    injected, rows = faults(log), find_violation_rows(log)
    assert {fault["fault"] for fault in injected} == set(_FAULTS), [f.group(0) for f in injected]
    for fault in injected:
        assert caught_at(fault, rows), fault.group(0)
    stray = [row for row in rows if row.reasons & ~_ALLOWED]
    assert not stray, "\n".join(row.to_line() for row in stray[:10])
    first_fault = min(int(fault["step"]) for fault in injected)
    early = [row for row in rows if row.step < first_fault]
    assert not early, "\n".join(row.to_line() for row in early[:10])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
