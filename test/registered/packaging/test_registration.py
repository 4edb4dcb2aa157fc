"""Every test file of the repo registers itself with SGLang's CI markers."""

import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import HWBackend, collect_tests, register_cpu_ci

register_cpu_ci(est_time=2, suite="kv-canary-cpu")

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_collect_tests_finds_every_test_file() -> None:
    files = sorted(str(p) for p in _ROOT.rglob("test_*.py"))
    assert len(files) >= 3
    registries = collect_tests(files, sanity_check=True)  # raises on an unregistered file
    assert {r.filename for r in registries} == set(files)
    for registry in registries:
        assert registry.est_time > 0
        assert registry.backend in (HWBackend.CPU, HWBackend.CUDA)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
