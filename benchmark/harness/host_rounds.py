"""Interleaved rounds of one host mode (:mod:`.host_modes`) over several canary
configurations: every round times each configuration in turn (the order rotated by one per
round), ``units_per_round`` units each, after each configuration's warm-up units. A round's
figures are the medians over its units of each part of a unit's host work (summed over the
unit's forwards, :class:`.simulated.ForwardCost`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from sglang.srt.kv_canary.config import parse_config

from .configs import CONFIGS
from .host_modes import HostMode
from .interleave import rotated
from .simulated import ForwardCost

PARTS = ("server_us", "init_new_us", "forward_us", "in_model_us", "sample_us", "launches")


def unit_figures(costs: Sequence[ForwardCost]) -> dict[str, float]:
    """One unit's figures: each part summed over its forwards."""
    return {part: float(sum(getattr(cost, part) for cost in costs)) for part in PARTS}


def round_figures(units: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One round's figures: each part's median over the round's units."""
    return {part: statistics.median(unit[part] for unit in units) for part in PARTS}


def measure_mode(mode: HostMode, *, configs: Sequence[str],
                 rounds: int) -> dict[str, list[dict[str, float]]]:
    """Per configuration, the figures of each of ``rounds`` interleaved rounds of ``mode``
    (after each configuration's warm-up units)."""
    runs = {name: mode.start(config=parse_config(CONFIGS[name].canary_env), rounds=rounds)
            for name in configs}
    for run in runs.values():
        for _ in range(mode.warm_up_units):
            run.unit()
    measured: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    for index in range(rounds):
        for name in rotated(configs, by=index):
            units = [unit_figures(runs[name].unit()) for _ in range(mode.units_per_round)]
            measured[name].append(round_figures(units))
    return measured
