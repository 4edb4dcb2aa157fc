"""Host time of the canary's eager launches: direct (``DirectLauncher``) vs Triton's normal call.

An eager forward (a prefill, an extend; a decode step that does not replay a graph) launches
the canary forward kernel twice (pre and post) and, when it admits requests, the admission
check. Their host time sits on the path to the first token. This script times, on one GPU,
per call and side by side in one process:

- ``launch_pre_forward`` + ``launch_post_forward`` with every check of the server's "all checks"
  configuration (``partial+tokens`` of ``bench_canary_kernels.py``), through the launcher
  (direct) and with the launcher forced to Triton's normal ``kernel[grid](...)`` call;
- ``launch_admission_owner_check`` of 64 rows, both ways;
- an empty Triton kernel's normal call, for scale.

It also checks that both ways leave identical device states (records, counters, owner chains;
the violation ring's rows as a multiset).

``--python-only`` runs on any machine (no launch, no GPU): per pre launch of the same batch on
CPU tensors, the Python of ``launch_pre_forward`` up to its launcher call (argument checks,
the bound launch of the state, the argument list) and the direct launcher's own key of those
arguments (the leading ones: the state's are bound once, ``DirectLauncher.with_tail``). Compare
versions on one machine, not absolute figures across machines.

Usage: ``python benchmark/bench_launch_host.py [--repeats 200] [--python-only]`` (without
``--python-only`` it needs CUDA; about a minute).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_canary_kernels import (  # noqa: E402
    SCENARIOS,
    _empty_kernel,
    batch_of,
    build_pool,
    clone,
    state_of,
)
from timing import host_time_us, ratio  # noqa: E402

from sglang.jit_kernel.kv_canary import admission_owner, canary_forward  # noqa: E402
from sglang.jit_kernel.kv_canary.consts import ROW_INDEX  # noqa: E402
from sglang.jit_kernel.kv_canary.direct_launch import TailLauncher, _launch_key  # noqa: E402

MODE = "partial+tokens"
SCENARIO_NAMES = ("decode bs=1 prefix=1k", "prefill 64 x 512, prefix=0")


def _timed(fn: Callable[[], None], *, repeats: int, launcher, direct: bool):
    launcher._direct = direct
    try:
        spread = host_time_us(fn=fn, repeats=repeats)
    finally:
        launcher._direct = True
    torch.cuda.synchronize()
    return spread


def _ring_rows(state) -> list[tuple[int, ...]]:
    """The written ring rows without their violation index, sorted: concurrent programs reserve
    ring rows in no fixed order."""
    ring = state.ring.cpu()
    return sorted(map(tuple, ring[ring.ne(0).any(dim=1)][:, :ROW_INDEX].tolist()))


def _states_equal(a, b) -> bool:
    return all(torch.equal(getattr(a, name), getattr(b, name))
               for name in ("records", "counters", "owner_chains")) and (
        _ring_rows(a) == _ring_rows(b))


def python_only(*, repeats: int) -> None:
    """The ``--python-only`` figures (see the module docstring)."""
    import bench_canary_kernels
    from triton.backends.compiler import BaseBackend

    launcher = canary_forward._LAUNCH
    if launcher._interpreted(canary_forward._canary_forward_kernel):
        raise SystemExit(
            "--python-only times the compiled kernel's launcher: unset TRITON_INTERPRET"
        )
    device, check_device = bench_canary_kernels.DEVICE, canary_forward.require_cuda_or_interpreter
    bench_canary_kernels.DEVICE = "cpu"
    try:
        scenario = next(s for s in SCENARIOS if s.name == SCENARIO_NAMES[0])
        pool = build_pool(scenario)
        batch, state = batch_of(pool, MODE), state_of(pool, MODE)
    finally:
        bench_canary_kernels.DEVICE = device
    recorded: dict[str, tuple] = {}

    def record(self, grid, *head) -> None:
        recorded["launcher"], recorded["head"] = self, head

    call = TailLauncher.__call__
    TailLauncher.__call__ = record
    canary_forward.require_cuda_or_interpreter = lambda **_: None  # a CPU state, never launched
    try:
        before = host_time_us(
            fn=lambda: canary_forward.launch_pre_forward(state=state, batch=batch),
            repeats=repeats)
    finally:  # the module as it was (a caller in the same process may launch for real)
        TailLauncher.__call__ = call
        canary_forward.require_cuda_or_interpreter = check_device
    bound, head = recorded["launcher"], recorded["head"]
    key = host_time_us(fn=lambda: _launch_key(0, BaseBackend, head, bound._head_parts),
                       repeats=repeats)
    print(f"canary forward pre launch, {scenario.name}, {MODE}: {len(head)} leading arguments "
          f"of {len(launcher._names)} (the rest bound once per device state and phase)")
    print(f"  launch_pre_forward up to the launcher call  {before.describe(unit=' us')}")
    print(f"  launch key of the leading arguments         {key.describe(unit=' us')}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--python-only", action="store_true",
                        help="time the launch's Python on CPU tensors, without a launch or a GPU")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} is invalid; allowed: an integer >= 1")
    if args.python_only:
        python_only(repeats=args.repeats)
        return
    if not torch.cuda.is_available():
        raise SystemExit("bench_launch_host.py needs CUDA")
    forward_launcher = canary_forward._LAUNCH
    if not forward_launcher._direct:
        raise SystemExit("this Triton does not launch directly (see direct_launch.py)")
    scratch = torch.zeros(1, device="cuda")
    empty = host_time_us(fn=lambda: _empty_kernel[(1,)](scratch), repeats=args.repeats)
    print(f"empty Triton kernel, normal call: {empty.describe(unit=' us')}")
    print(f"{'launch':44s} {'normal call':>22s} {'direct':>22s} {'normal / direct':>16s}")
    for scenario in (s for s in SCENARIOS if s.name in SCENARIO_NAMES):
        pool = build_pool(scenario)
        batch = batch_of(pool, MODE)
        state = state_of(pool, MODE)

        def pre_and_post(state=state, batch=batch) -> None:
            canary_forward.launch_pre_forward(state=state, batch=batch)
            canary_forward.launch_post_forward(state=state, batch=batch)

        # identical effects both ways (the launches are repeated on fresh copies of the state)
        normal_state, direct_state = clone(state), clone(state)
        for target, direct in ((normal_state, False), (direct_state, True)):
            forward_launcher._direct = direct
            for _ in range(3):
                pre_and_post(state=target)
        forward_launcher._direct = True
        torch.cuda.synchronize()
        if not _states_equal(normal_state, direct_state):
            raise SystemExit(f"{scenario.name}: direct launches left another state")
        normal = _timed(pre_and_post, repeats=args.repeats, launcher=forward_launcher,
                        direct=False)
        direct = _timed(pre_and_post, repeats=args.repeats, launcher=forward_launcher,
                        direct=True)
        print(f"{'pre + post, ' + scenario.name:44s} {normal.describe(unit=' us'):>22s} "
              f"{direct.describe(unit=' us'):>22s} "
              f"{ratio(numerator=normal, denominator=direct).describe(unit='x'):>16s}")
    rows = torch.arange(1, 65, device="cuda")
    zeros = torch.zeros(64, dtype=torch.int64, device="cuda")

    def admission() -> None:
        admission_owner.launch_admission_owner_check(
            state=state, req_pool_indices=rows, prefix_lens=zeros, chains=zeros
        )

    admission()
    normal = _timed(admission, repeats=args.repeats, launcher=admission_owner._LAUNCH,
                    direct=False)
    direct = _timed(admission, repeats=args.repeats, launcher=admission_owner._LAUNCH,
                    direct=True)
    print(f"{'admission check, 64 rows':44s} {normal.describe(unit=' us'):>22s} "
          f"{direct.describe(unit=' us'):>22s} "
          f"{ratio(numerator=normal, denominator=direct).describe(unit='x'):>16s}")


if __name__ == "__main__":
    main()
