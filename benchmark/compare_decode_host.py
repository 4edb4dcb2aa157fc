"""``bench_decode_host.py``: this checkout against another git revision, in one process.

On a shared or virtual machine the same pure-Python work runs at speeds that differ by 1.4x and
more from one process to the next and over seconds, so two versions' host paths timed in turn, a
fresh process each, differ by more than a few-percent change between them. This script instead
loads both versions into one process and alternates them round by round (the order flips every
round), each round one :func:`bench_decode_host.measure` of ``--steps`` decode steps per version,
and prints per batch size each version's median and the median (with quartiles) of the per-round
ratios, this checkout over the revision.

The revision's ``sglang/srt/kv_canary`` and ``sglang/jit_kernel/kv_canary`` (and its
``benchmark/bench_decode_host.py``) are taken with ``git show`` into a temporary folder, with
every ``sglang.srt.kv_canary`` / ``sglang.jit_kernel.kv_canary`` reference renamed to
``..._rev``, and imported through ``sglang.srt`` / ``sglang.jit_kernel``'s package paths. Nothing
is installed or written outside that folder. This checkout's package is the installed one
(``pip install .`` first). Runs on any machine (no GPU).

Usage: ``python benchmark/compare_decode_host.py --against REV [--rounds 40] [--steps 300]
[--batches 1,64]``
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import sglang.jit_kernel
import sglang.srt

REPO = Path(__file__).resolve().parent.parent
_PACKAGES = ("python/sglang/srt/kv_canary", "python/sglang/jit_kernel/kv_canary")
_RENAME = re.compile(r"\b(sglang[./](?:srt|jit_kernel)[./]kv_canary)\b")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True).stdout


def load_revision(revision: str, *, into: Path) -> ModuleType:
    """The revision's ``bench_decode_host`` module, importing the revision's package (renamed);
    its sources written under ``into``.

    Raises:
        subprocess.CalledProcessError: ``revision`` is not a revision of this repository, or
            lacks the package or the benchmark.
    """
    for package in _PACKAGES:
        for path in _git("ls-tree", "-r", "--name-only", revision, package).split():
            text = _git("show", f"{revision}:{path}")
            parent, name = package.rsplit("/", 1)
            relative = path[len(package) + 1 :]
            target = into / parent.split("/")[-1] / f"{name}_rev" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_RENAME.sub(r"\1_rev", text))
    sglang.srt.__path__.append(str(into / "srt"))
    sglang.jit_kernel.__path__.append(str(into / "jit_kernel"))
    bench = into / "bench_decode_host_rev.py"
    source = _git("show", f"{revision}:benchmark/bench_decode_host.py")
    bench.write_text(_RENAME.sub(r"\1_rev", source))
    sys.path.insert(0, str(into))
    return importlib.import_module("bench_decode_host_rev")


def _ratio_line(ratios: list[float]) -> str:
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return (f"{statistics.median(ratios):.3f} (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, "
            f"{len(ratios)} rounds)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=40, help="rounds per batch size (default 40)")
    parser.add_argument("--steps", type=int, default=300,
                        help="measured decode steps per version and round (default 300)")
    parser.add_argument("--batches", default="1,64",
                        help="comma-separated batch sizes (default 1,64)")
    options = parser.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(options, name) < 1:
            parser.error(f"--{name}={getattr(options, name)} is invalid; allowed: an integer >= 1")
    try:
        batches = [int(value) for value in options.batches.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        parser.error(f"--batches={options.batches!r} is invalid; allowed: integers >= 1, "
                     "comma-separated")
    sys.path.insert(0, str(REPO / "benchmark"))
    import bench_decode_host as this_checkout

    with tempfile.TemporaryDirectory(prefix="kv-canary-rev-") as folder:
        try:
            revision = load_revision(options.against, into=Path(folder))
        except subprocess.CalledProcessError as error:
            parser.error(f"--against={options.against!r}: git failed: {error.stderr.strip()}")
        versions = (("checkout", this_checkout), (options.against, revision))
        print(f"# this checkout ({_git('rev-parse', '--short', 'HEAD').strip()}, with its "
              f"uncommitted changes as installed) vs {options.against}; median µs per decode step "
              "of the canary's two per-step hooks (bench_decode_host.py)")
        for requests in batches:
            sums: dict[str, list[float]] = {name: [] for name, _ in versions}
            for round_index in range(options.rounds):
                order = versions if round_index % 2 == 0 else versions[::-1]
                for name, module in order:
                    init_new, run_forward = module.measure(requests=requests, steps=options.steps)
                    sums[name].append(init_new + run_forward)
            ratios = [ours / theirs for ours, theirs in zip(*sums.values())]
            medians = ", ".join(f"{name} {statistics.median(values):.1f}"
                                for name, values in sums.items())
            print(f"batch {requests}: {medians}; checkout / {options.against} by round "
                  f"{_ratio_line(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
