"""The whole ``launch_server`` path of sglang 0.5.12.post1 imports on this fresh install.

This is what the pins in ``constraints/sglang-0.5.12.post1.txt`` protect: a newer release of an
unpinned dependency that breaks an import shows up here first. The launch path imports CUDA-only
extensions at module level, so a child interpreter fakes an sm90 device (``fake_sm90/``).
"""

import os
import pathlib
import subprocess
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="kv-canary-cpu")

_FAKE_DEVICE_DIR = pathlib.Path(__file__).resolve().parent / "fake_sm90"
LAUNCH_PATH_MODULES = (
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.model_executor.cuda_graph_runner",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.sampler",
    "sglang.srt.models.llama",
    "sglang.srt.models.qwen3",
    "sglang.srt.speculative.eagle_worker_v2",
)


_IMPORT_EACH = """
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name)
        print(f"--- import {name} failed:", traceback.format_exc(limit=-5), file=sys.stderr)
print("FAILED:" + ",".join(failed))
"""


def test_launch_path_imports() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_FAKE_DEVICE_DIR), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _IMPORT_EACH, *LAUNCH_PATH_MODULES],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().splitlines()[-1] == "FAILED:", result.stderr[-6000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
