"""``bench_decode_host.py`` (or ``bench_request_host.py``): this checkout against another git
revision, in one process.

On a shared or virtual machine the same pure-Python work runs at speeds that differ by 1.4x and
more from one process to the next and over seconds, so two versions' host paths timed in turn, a
fresh process each, differ by more than a few-percent change between them. This script instead
loads both versions into one process and alternates them round by round (the order flips every
round), each round one :func:`bench_decode_host.measure` of ``--steps`` decode steps per version,
and prints per batch size each version's median and the median (with quartiles) of the per-round
ratios, this checkout over the revision.

The revision's ``sglang/srt/kv_canary`` and ``sglang/jit_kernel/kv_canary`` are taken with
``git show`` into a temporary folder, with every ``sglang.srt.kv_canary`` /
``sglang.jit_kernel.kv_canary`` reference renamed to ``..._rev``, and imported through
``sglang.srt`` / ``sglang.jit_kernel``'s package paths; so is the benchmark, the revision's
``bench_decode_host.py`` or this checkout's ``bench_request_host.py`` (newer than the revisions
it is compared with; it drives the package through hooks every revision has), and the
simulated server such a benchmark imports (``benchmark/simulated_canary.py``, from the same
place as the benchmark). Nothing is installed or written outside that folder. This checkout's package is the installed one (``pip
install .`` first). Runs on any machine (no GPU).

``--bench request`` compares the canary's host work per batch-1 request (prefill and first
decode step, ``bench_request_host.py``) for each of ``--configs``, ``--steps`` requests per
version and round.

Usage: ``python benchmark/compare_decode_host.py --against REV [--bench decode|request]
[--rounds 40] [--steps 300] [--batches 1,64] [--configs canary,all-checks]``
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
from typing import Any

import sglang.jit_kernel
import sglang.srt

REPO = Path(__file__).resolve().parent.parent
_PACKAGES = ("python/sglang/srt/kv_canary", "python/sglang/jit_kernel/kv_canary")
_RENAME = re.compile(r"\b(sglang[./](?:srt|jit_kernel)[./]kv_canary)\b")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True,
                          text=True).stdout


def load_revision(revision: str, *, into: Path, bench: str = "decode") -> ModuleType:
    """The benchmark module (``bench``: the revision's ``bench_decode_host``, or this checkout's
    ``bench_request_host``), importing the revision's package (renamed); its sources written
    under ``into``.

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
    name = f"bench_{bench}_host"
    source = _benchmark_source(revision, name, from_revision=bench == "decode")
    if _HELPER in source:  # the simulated server, importing the package: the revision's too
        helper = _benchmark_source(revision, _HELPER, from_revision=bench == "decode")
        (into / f"{_HELPER}_rev.py").write_text(_RENAME.sub(r"\1_rev", helper))
        source = source.replace(f"from {_HELPER} import", f"from {_HELPER}_rev import")
    (into / f"{name}_rev.py").write_text(_RENAME.sub(r"\1_rev", source))
    sys.path.insert(0, str(into))
    return importlib.import_module(f"{name}_rev")


_HELPER = "simulated_canary"  # benchmark/simulated_canary.py


def _benchmark_source(revision: str, name: str, *, from_revision: bool) -> str:
    """``benchmark/NAME.py`` of the revision (``from_revision``), else of this checkout."""
    if from_revision:
        return _git("show", f"{revision}:benchmark/{name}.py")
    return (REPO / "benchmark" / f"{name}.py").read_text()


def _ratio_line(ratios: list[float]) -> str:
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return (f"{statistics.median(ratios):.3f} (quartiles {quartiles[0]:.3f}-{quartiles[2]:.3f}, "
            f"{len(ratios)} rounds)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision to compare with")
    parser.add_argument("--bench", choices=("decode", "request"), default="decode",
                        help="decode: steady decode steps (bench_decode_host.py, default); "
                             "request: batch-1 requests (bench_request_host.py)")
    parser.add_argument("--rounds", type=int, default=40,
                        help="rounds per batch size or configuration (default 40)")
    parser.add_argument("--steps", type=int, default=300,
                        help="measured decode steps (--bench decode) or requests (--bench "
                             "request) per version and round (default 300)")
    parser.add_argument("--batches", default="1,64",
                        help="--bench decode: comma-separated batch sizes (default 1,64)")
    parser.add_argument("--configs", default="canary,all-checks",
                        help="--bench request: comma-separated configurations of "
                             "bench_request_host.py (default canary,all-checks)")
    options = parser.parse_args(argv)
    for name in ("rounds", "steps"):
        if getattr(options, name) < 1:
            parser.error(f"--{name}={getattr(options, name)} is invalid; allowed: an integer >= 1")
    sys.path.insert(0, str(REPO / "benchmark"))
    if options.bench == "decode":
        try:
            cases = [int(value) for value in options.batches.split(",")]
        except ValueError:
            cases = []
        if not cases or min(cases) < 1:
            parser.error(f"--batches={options.batches!r} is invalid; allowed: integers >= 1, "
                         "comma-separated")
        import bench_decode_host as this_checkout
    else:
        import bench_request_host as this_checkout

        cases = [name.strip() for name in options.configs.split(",")]
        unknown = [name for name in cases if name not in this_checkout.CONFIGS]
        if unknown:
            parser.error(f"--configs={options.configs!r}: unknown {unknown}; allowed: "
                         f"{', '.join(this_checkout.CONFIGS)}")

    def measure(module: ModuleType, case: Any) -> float:
        if options.bench == "decode":
            return sum(module.measure(requests=case, steps=options.steps))
        return module.measure(config=case, requests=options.steps, prompt=128).total

    with tempfile.TemporaryDirectory(prefix="kv-canary-rev-") as folder:
        try:
            revision = load_revision(options.against, into=Path(folder), bench=options.bench)
        except subprocess.CalledProcessError as error:
            parser.error(f"--against={options.against!r}: git failed: {error.stderr.strip()}")
        versions = (("checkout", this_checkout), (options.against, revision))
        unit = ("decode step of the canary's two per-step hooks (bench_decode_host.py)"
                if options.bench == "decode" else
                "batch-1 request of the canary's hooks (prefill and first decode step, "
                "bench_request_host.py)")
        print(f"# this checkout ({_git('rev-parse', '--short', 'HEAD').strip()}, with its "
              f"uncommitted changes as installed) vs {options.against}; median µs per {unit}")
        for case in cases:
            sums: dict[str, list[float]] = {name: [] for name, _ in versions}
            for round_index in range(options.rounds):
                order = versions if round_index % 2 == 0 else versions[::-1]
                for name, module in order:
                    sums[name].append(measure(module, case))
            ratios = [ours / theirs for ours, theirs in zip(*sums.values())]
            medians = ", ".join(f"{name} {statistics.median(values):.1f}"
                                for name, values in sums.items())
            label = f"batch {case}" if options.bench == "decode" else case
            print(f"{label}: {medians}; checkout / {options.against} by round "
                  f"{_ratio_line(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
