"""End-to-end on a GPU: the canary never makes the host wait for the device while serving.

A host sync in a hook (a ``.item()``, a ``.tolist()`` of a device tensor, a blocking copy) would
stall the scheduler until the GPU drained, on every forward that takes that path: invisible to
the detection tests, costly to every request. The server here loads
``sync_check/sitecustomize.py`` (beside this file) with ``KV_CANARY_SYNC_CHECK=1``: from the end of
start-up on, torch's CUDA sync debug mode reports every synchronizing call, and the log counts
those made from a ``kv_canary`` line apart from SGLang's own. Every check is on (token oracle,
partial real data, both token checks) and the traffic covers batch-1 requests, concurrent
prefills, cached prefixes and long decodes.

The first test shows the sync check itself sees a canary line that synchronizes (in this
process), so a zero from the server means something.
"""

import os
import pathlib
import random
import re
import sys

import pytest
import torch
from _workloads import assert_clean_canary_log, concurrent_traffic, polled_log, request, tokens

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="kv-canary-gpu")

_SYNC_CHECK_DIR = pathlib.Path(__file__).resolve().parent / "sync_check"
_ALL_CHECKS = {
    "SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1",
    "SGLANG_KV_CANARY_REAL_DATA": "partial", "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
    "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1",
}
_TOTALS_RE = re.compile(r"KV canary sync check over (\d+) forwards: canary (\d+), elsewhere (\d+)")


def _sitecustomize():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kv_canary_sync_check",
                                                  _SYNC_CHECK_DIR / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.gpu
def test_the_sync_check_sees_a_canary_line_that_synchronizes() -> None:
    check = _sitecustomize()._SyncCheck()
    # a function whose code claims a kv_canary file, as a hook's would
    namespace: dict = {}
    exec(compile("def read(t):\n    return t.item()\n", "/pkg/sglang/srt/kv_canary/probe.py",
                 "exec"), namespace)
    values = torch.arange(4, device="cuda")
    check.start()
    try:
        namespace["read"](values[2])
        values.sum().tolist()  # this file's line: elsewhere
        values.add_(1)  # no sync
    finally:
        check.stop()
    assert check.canary == {"/pkg/sglang/srt/kv_canary/probe.py:2": 1}
    assert check.elsewhere == 1


@pytest.mark.gpu
def test_the_canary_never_synchronizes_the_device_while_serving(canary_server) -> None:
    python_path = os.pathsep.join(
        part for part in (str(_SYNC_CHECK_DIR), os.environ.get("PYTHONPATH", "")) if part)
    server = canary_server(
        env={**_ALL_CHECKS, "PYTHONPATH": python_path, "KV_CANARY_SYNC_CHECK": "1"},
        args=("--sampling-backend", "token_oracle", "--cuda-graph-max-bs", "16"))
    rng = random.Random(11)
    shared = tokens(rng, 96)
    for index in range(12):  # batch-1 requests, each after the last: prefill then decode
        server.generate(request(f"one-{index}", tokens(rng, 40), 6))
    # requests with a cached prefix, concurrently (admissions of cached rows)
    server.generate_many([request(f"cached-{i}", shared + tokens(rng, 20), 12) for i in range(8)],
                         concurrency=8)
    concurrent_traffic(server, rounds=3, per_round=12, new_tokens=40)
    server.generate_many([request(f"long-{i}", tokens(rng, 64), 300) for i in range(4)],
                         concurrency=4)
    log = polled_log(server)
    assert "KV canary sync check: CUDA sync debug mode on" in log, log[-3000:]
    first_sync = log.find("canary code synchronized at")
    assert first_sync < 0, log[first_sync:first_sync + 3000]  # the line and its stack
    totals = [m for m in map(_TOTALS_RE.search, log.splitlines()) if m]
    assert totals, "no sync-check line: fewer forwards than one line's worth"
    forwards, canary, _ = map(int, totals[-1].groups())
    assert canary == 0 and forwards >= 256, totals[-1][0]
    assert_clean_canary_log(log)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
