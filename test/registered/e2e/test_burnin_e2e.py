"""End-to-end on a GPU: ``python -m sglang.srt.kv_canary.burnin`` starts the tiny-model server in
raise mode with every check on (real data, verify-token, the token oracle with its write-input
assert, the radix sweep), mixed-chunk prefill, page size 16 and a small KV pool, drives it with
its whole request mix for two minutes and finds no violation (exit 0)."""

import os
import re
import signal
import subprocess
import sys

import pytest

from sglang.srt.kv_canary.tools.server import TINY_MODEL_SERVER_ARGS
from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=300, suite="kv-canary-gpu")

_DURATION_S = 120
_TIMEOUT_S = 480
_ALL_CHECKS = (
    "SGLANG_KV_CANARY_MODE=raise",
    "SGLANG_KV_CANARY_REAL_DATA=partial",
    "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT=1",
    "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1",
    "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT=1",
    "SGLANG_KV_CANARY_SWEEP_INTERVAL=8",
    "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS=100",
    "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS=100",
)
# The tiny-model flags, then (later flags win) the oracle sampler and what the burn-in qualifies.
_SERVER_ARGS = (*TINY_MODEL_SERVER_ARGS, "--sampling-backend", "token_oracle",
                "--enable-mixed-chunk", "--page-size", "16", "--chunked-prefill-size", "1024",
                "--max-total-tokens", "16384")
_PROCESS_GROUP = re.compile(r"\(process group (\d+)\)")


def _kill_group(output: str) -> None:
    found = _PROCESS_GROUP.search(output)
    if found:
        try:
            os.killpg(int(found.group(1)), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.gpu
def test_burn_in_of_every_check_with_mixed_chunk_and_page_16_is_clean(
        tiny_model_dir, tmp_path, keep_log) -> None:
    log = tmp_path / "burnin-server.log"
    command = [sys.executable, "-m", "sglang.srt.kv_canary.burnin",
               "--model-path", str(tiny_model_dir), "--server-log", str(log),
               "--duration-s", str(_DURATION_S), "--ready-timeout-s", "300",
               "--request-timeout-s", "120", "--seed", "11",
               *(f"--canary-env={pair}" for pair in _ALL_CHECKS), "--", *_SERVER_ARGS]
    burnin = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = err = ""
    try:
        out, err = burnin.communicate(timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        burnin.send_signal(signal.SIGINT)  # the burn-in stops its server on the way out
        try:
            out, err = burnin.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            burnin.kill()
            out, err = burnin.communicate()
            _kill_group(err)
        pytest.fail(f"the burn-in ran past {_TIMEOUT_S} s:\n{out[-4000:]}\n{err[-4000:]}")
    finally:
        keep_log(log)
    assert burnin.returncode == 0, f"{out[-6000:]}\n--- stderr:\n{err[-4000:]}"
    assert "violations   : 0" in out and "RESULT: clean: no violation" in out, out
    assert "canary       : KV canary enabled: mode=raise" in out, out
    assert f"stopped: the duration ({_DURATION_S} s) was reached" in out, out
    assert "[kv_canary burnin] progress " in err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
