"""``benchmark/compare_decode_host.py`` runs on a CPU: it loads a git revision's package beside
the installed one and prints both versions' medians and the per-round ratio for each batch size
(``--bench request``: for each configuration of batch-1 requests); bad arguments (and a revision git does not know) are refused with the flag, the value and what
is allowed."""

import pathlib
import re
import subprocess
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="kv-canary-cpu")

REPO = pathlib.Path(__file__).resolve().parents[3]
SCRIPT = REPO / "benchmark" / "compare_decode_host.py"
pytestmark = pytest.mark.skipif(
    subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True).returncode
    != 0,
    reason="the checkout is not a git work tree with a HEAD (the script compares revisions)",
)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    # a process of its own: the revision's package registers its own sampler factory
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True,
                          timeout=600)


def test_a_small_run_against_head_prints_both_versions_and_the_ratio() -> None:
    done = _run("--against", "HEAD", "--rounds", "2", "--steps", "3", "--batches", "2")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"batch 2: checkout [\d.]+, HEAD [\d.]+; checkout / HEAD by round [\d.]+ "
        r"\(quartiles [\d.]+-[\d.]+, 2 rounds\)", line
    ), line


def test_the_request_bench_compares_each_configuration() -> None:
    done = _run("--against", "HEAD", "--bench", "request", "--rounds", "2", "--steps", "2",
                "--configs", "canary")
    assert done.returncode == 0, done.stderr
    header, line = done.stdout.strip().splitlines()[-2:]
    assert "per batch-1 request" in header
    assert re.fullmatch(
        r"canary: checkout [\d.]+, HEAD [\d.]+; checkout / HEAD by round [\d.]+ "
        r"\(quartiles [\d.]+-[\d.]+, 2 rounds\)", line
    ), line


@pytest.mark.parametrize("bench", ["decode", "request"])
def test_the_revision_s_benchmark_drives_the_revision_s_package(bench: str, tmp_path) -> None:
    """The revision's side imports the renamed package only, through the simulated server too
    (``benchmark/simulated_canary.py``): the two sides never share the canary's code."""
    probe = (
        "import sys, pathlib; sys.path.insert(0, sys.argv[1]); import compare_decode_host as c\n"
        "m = c.load_revision('HEAD', into=pathlib.Path(sys.argv[2]), bench=sys.argv[3])\n"
        "from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner\n"
        "print(m.CanaryRunner.__module__, m.CanaryRunner is CanaryRunner)\n"
        "helper = getattr(m, 'canary_server', None)\n"
        "if helper is not None:\n"
        "    print(helper.__module__, helper.__globals__['install_canary_runner'].__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(SCRIPT.parent), str(tmp_path), bench],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "sglang.srt.kv_canary_rev.runner.canary_runner False"
    assert lines[1] == "simulated_canary_rev sglang.srt.kv_canary_rev.selfcheck.scenarios"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bench", "request", "--configs", "canary,fast"],
         "--configs='canary,fast': unknown ['fast']; allowed: canary, all-checks"),
        (["--bench", "prefill"], "argument --bench: invalid choice: 'prefill'"),
        (["--rounds", "0"], "--rounds=0 is invalid; allowed: an integer >= 1"),
        (["--steps", "0"], "--steps=0 is invalid; allowed: an integer >= 1"),
        (["--batches", "1,x"], "--batches='1,x' is invalid; allowed: integers >= 1"),
        (["--against", "no-such-revision"], "--against='no-such-revision': git failed"),
    ],
)
def test_bad_arguments_are_refused(argv: list[str], message: str) -> None:
    if "--against" not in argv:
        argv = ["--against", "HEAD", *argv]
    done = _run(*argv)
    assert done.returncode == 2
    assert message in done.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
