"""``python -m sglang.srt.kv_canary.selfcheck [--kernels reference|triton] [--page-sizes 1 4]``."""

from __future__ import annotations

import argparse
import sys
import time

from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.selfcheck.scenarios import default_scenarios, run_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang.srt.kv_canary.selfcheck",
        description="CPU self-check of the KV canary runtime (no GPU needed).",
    )
    parser.add_argument(
        "--kernels",
        choices=[backend.value for backend in KernelBackend],
        default=KernelBackend.TORCH_REFERENCE.value,
        help="torch reference kernels (default), or the Triton kernels (set TRITON_INTERPRET=1 "
        "on a CPU)",
    )
    parser.add_argument("--page-sizes", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args(argv)
    kernels = load_kernels(KernelBackend(args.kernels))
    start = time.monotonic()
    print(
        f"KV canary self-check: {kernels.backend.value} kernels on cpu, SGLang ReqToTokenPool + "
        "MHATokenToKVPool (and SWAKVPool with a 6-token window, FP8 and FP4 MHA pools, bf16 and "
        "FP8 MLATokenToKVPool), mixed workload (prefill at page "
        "boundaries +-1, chunked + mixed "
        "prefill, decode, shared prefixes A->B->A, parallel sampling, padded rows, eviction), "
        "and a host-tier workload (shared prefixes backed up, evicted, overwritten and loaded "
        "back from a host KV pool); runtime perturbations and persistent scheduler/engine bugs"
    )
    scenarios = default_scenarios()
    width = max(len(scenario.name) for scenario in scenarios)
    print(f"{'page':>4}  {'scenario':<{width}} {'forwards':>8} {'faults':>6}  result")
    failures = 0
    for page_size in args.page_sizes:
        for scenario in scenarios:
            outcome = run_scenario(scenario, page_size=page_size, kernels=kernels)
            failures += not outcome.passed
            verdict = "PASS" if outcome.passed else "FAIL"
            faults = str(outcome.faults) if outcome.faults else "-"
            print(
                f"{page_size:>4}  {scenario.name:<{width}} {outcome.forwards:>8} {faults:>6}  "
                f"{verdict}  {outcome.detail}"
            )
    print(
        f"{'all passed' if not failures else f'{failures} FAILED'} "
        f"({time.monotonic() - start:.1f} s)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
