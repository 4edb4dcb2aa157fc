"""End-to-end: the main job, ``python -m sglang.srt.kv_canary.demo``, on a GPU: it launches SGLang
with the canary on, runs its workload, reports the canary's start-up line and no violation, and
exits 0."""

import os
import re
import signal
import subprocess
import sys

import pytest

from sglang.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=240, suite="kv-canary-gpu")

_TIMEOUT_S = 480
_SERVER_LINE = re.compile(r"server log: (\S+) \(process group (\d+)\)")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.gpu
def test_demo_runs_its_workload_with_the_canary_on_and_sees_no_violation(keep_log) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_KV_CANARY_")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "sglang.srt.kv_canary.demo", "--ready-timeout-s", "360"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    output = ""
    try:
        output, _ = demo.communicate(timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        demo.send_signal(signal.SIGINT)  # the demo stops its server on the way out
        try:
            output, _ = demo.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            demo.kill()
            output, _ = demo.communicate()
            server = _SERVER_LINE.search(output)
            if server:
                _kill_group(int(server.group(2)))  # the demo could not stop its server
        pytest.fail(f"the demo ran past {_TIMEOUT_S} s; output:\n{output[-4000:]}")
    finally:
        server = _SERVER_LINE.search(output)
        if server:
            keep_log(server.group(1))
    assert demo.returncode == 0, output[-6000:]
    assert "server ready after" in output and "workload: 48 requests" in output
    assert "start-up : KV canary enabled: mode=log" in output
    assert "violations: 0" in output and "RESULT: no violation" in output


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
