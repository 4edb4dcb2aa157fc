"""Launch-shape sweep of the canary forward kernel: programs per SM x warps x verify tile, on the
decode scenarios whose verify dominates a step (64 x 8k and 1 x 32k prefixes), with partial real
data and every token check, on shuffled and contiguous slot layouts.

Prints, per variant, the graph-replayed time of the pre and post launches (``timing.graph_time_us``,
20 launches per graph) and the ratio to the shipped shape (the first row of each block). It
patches the kernel module's ``TILES`` / ``NUM_WARPS`` and ``launch_config.PROGRAMS_PER_SM`` in
this process only. Usage (needs CUDA; about two minutes on an H200, most of it compiling)::

    python benchmark/tune_canary_forward.py [--scenarios 64x8k,1x32k]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_canary_kernels import (  # noqa: E402
    SCENARIOS,
    batch_of,
    build_pool,
    state_of,
)
from timing import graph_time_us  # noqa: E402

from sglang.jit_kernel.kv_canary import canary_forward, launch_config  # noqa: E402
from sglang.jit_kernel.kv_canary.consts import (  # noqa: E402
    COUNTER_KERNEL_RUNS,
    COUNTER_STEP,
    COUNTER_VIOLATIONS,
    CheckKind,
)

_SCENARIO_NAMES = {"64x8k": "decode bs=64 prefix=8k", "1x32k": "decode bs=1 prefix=32k"}
PROGRAMS_PER_SM = (4, 8, 16)
WARPS = (4, 8)
VERIFY_TILES = (512, 256, 1024)  # the shipped tile first
MODES = ("partial+tokens",)  # what the server's "all checks" gives the kernels


def _apply(*, programs_per_sm: int, warps: int, verify_tile: int) -> None:
    launch_config.PROGRAMS_PER_SM = programs_per_sm
    launch_config._cuda_programs.cache_clear()
    canary_forward.NUM_WARPS = warps
    canary_forward.TILES = dataclasses.replace(canary_forward.TILES, verify_tile=verify_tile)


def _time(pool, mode: str) -> tuple[float, float]:
    state = state_of(pool, mode)
    batch = batch_of(pool, mode)
    pre = graph_time_us(
        fn=lambda: canary_forward.launch_pre_forward(state=state, batch=batch)
    ).median
    state.owner_chains.copy_(pool.owners_after)
    state.counters[COUNTER_KERNEL_RUNS + CheckKind.PRE_VERIFY] = state.counters[COUNTER_STEP] + 1
    state.counters[COUNTER_VIOLATIONS] = 0
    post = graph_time_us(
        fn=lambda: canary_forward.launch_post_forward(state=state, batch=batch)
    ).median
    torch.cuda.synchronize()
    if int(state.counters[COUNTER_VIOLATIONS]):
        raise RuntimeError(f"post launches reported violations ({mode}): the setup is broken")
    return pre, post


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="64x8k,1x32k",
                        help=f"comma-separated, of {sorted(_SCENARIO_NAMES)}")
    names = [_SCENARIO_NAMES[key] for key in parser.parse_args().scenarios.split(",")]
    torch.manual_seed(0)
    shipped = (launch_config.PROGRAMS_PER_SM, canary_forward.NUM_WARPS,
               canary_forward.TILES.verify_tile)
    variants = [shipped] + [
        v for v in itertools.product(PROGRAMS_PER_SM, WARPS, VERIFY_TILES) if v != shipped
    ]
    print(f"device: {torch.cuda.get_device_name()}; shipped (programs/SM, warps, verify tile): "
          f"{shipped}")
    header = f"{'scenario':24} {'slots':10} {'checks':14} {'prog/SM':>7} {'warps':>5} " \
             f"{'tile':>5} {'pre us':>8} {'post us':>8} {'x shipped':>9}"
    print(header)
    print("-" * len(header))
    for scenario in (s for s in SCENARIOS if s.name in names):
        for contiguous in (False, True):
            pool = build_pool(scenario, contiguous_slots=contiguous)
            for mode in MODES:
                base = None
                for programs, warps, tile in variants:
                    _apply(programs_per_sm=programs, warps=warps, verify_tile=tile)
                    pre, post = _time(pool, mode)
                    base = base or pre + post
                    layout = "contiguous" if contiguous else "shuffled"
                    print(f"{scenario.name[7:]:24} {layout:10} {mode:14} {programs:7} "
                          f"{warps:5} {tile:5} {pre:8.1f} {post:8.1f} "
                          f"{(pre + post) / base:9.2f}", flush=True)
            del pool
            torch.cuda.empty_cache()
    _apply(programs_per_sm=shipped[0], warps=shipped[1], verify_tile=shipped[2])


if __name__ == "__main__":
    main()
