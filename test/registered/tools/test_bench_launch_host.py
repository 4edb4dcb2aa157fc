"""``benchmark/bench_launch_host.py --python-only`` runs on a CPU (no launch, no GPU): it times
the canary forward launch's Python up to its launcher and the launcher's key of the leading
arguments (the rest bound once per device state and phase); a bad ``--repeats`` is refused with
the flag, the value and what is allowed."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="kv-canary-cpu")

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "benchmark" / "bench_launch_host.py"


def _run(*argv: str) -> subprocess.CompletedProcess:
    # a process of its own: other tests load the kernels interpreted (TRITON_INTERPRET=1)
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True,
                          env=env, timeout=300)


def test_python_only_times_the_launch_and_the_key_of_its_leading_arguments() -> None:
    result = _run("--python-only", "--repeats", "50")
    assert result.returncode == 0, result.stderr
    from sglang.jit_kernel.kv_canary import canary_forward

    parameters = len(canary_forward._LAUNCH._names)
    assert f": 25 leading arguments of {parameters} " in result.stdout, result.stdout
    for part in ("launch_pre_forward up to the launcher call",
                 "launch key of the leading arguments"):
        assert re.search(rf"{part}\s+\d+\.\d+ us \(", result.stdout), (part, result.stdout)


def test_a_bad_repeat_count_is_refused() -> None:
    result = _run("--repeats", "0")
    assert result.returncode == 2
    assert "--repeats=0 is invalid; allowed: an integer >= 1" in result.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
