"""The built wheel holds only our subpackages: no file that SGLang owns."""

import pathlib
import subprocess
import sys
import zipfile

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="kv-canary-cpu")

_REPO = pathlib.Path(__file__).resolve().parents[3]
_OURS = ("sglang/srt/kv_canary/", "sglang/jit_kernel/kv_canary/", "sglang_kv_canary-")


def test_wheel_contains_only_our_subpackages(tmp_path: pathlib.Path) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(tmp_path), str(_REPO)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = tmp_path.glob("sglang_kv_canary-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    foreign = [n for n in names if not n.startswith(_OURS)]
    assert foreign == []
    assert "sglang/__init__.py" not in names and "sglang/srt/__init__.py" not in names
    assert "sglang/srt/kv_canary/plugin.py" in names
    assert any(n.startswith("sglang/jit_kernel/kv_canary/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[sglang.srt.plugins]" in text and "sglang.srt.kv_canary.plugin:activate" in text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
