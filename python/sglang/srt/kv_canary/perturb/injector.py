"""Seeded, warmed-up choice of the perturbations of each forward step."""

from __future__ import annotations

import logging
import random

from sglang.jit_kernel.kv_canary.batch_view import CanaryDeviceState
from sglang.srt.kv_canary.config import PerturbConfig
from sglang.srt.kv_canary.perturb.fault import InjectedFault, Perturbation
from sglang.srt.kv_canary.perturb.input_ids import InputIdsPerturbation
from sglang.srt.kv_canary.perturb.live_rows import live_rows
from sglang.srt.kv_canary.perturb.real_kv_used import RealKvUsedPerturbation
from sglang.srt.kv_canary.perturb.req_to_token import ReqToTokenPerturbation

logger = logging.getLogger(__name__)


class FaultInjector:
    """Draws, per forward step after the warm-up, whether each perturbation fires.

    The draws come from one ``random.Random(seed)``: the same sequence of batches gets the same
    faults. Every injected fault is logged at INFO as one ``kv_canary perturb:`` line.
    """

    def __init__(
        self,
        *,
        warmup_steps: int,
        seed: int,
        perturbations: list[tuple[float, Perturbation]],
    ) -> None:
        self._warmup_steps = warmup_steps
        self._rng = random.Random(seed)
        self._perturbations = perturbations

    def inject(self, *, forward_batch: object, step: int) -> list[InjectedFault]:
        """Inject this step's faults (host side, before the forward, never syncs).

        Args:
            forward_batch: the live (non-idle) batch ``ModelRunner.forward`` received.
            step: 0-based index of this forward among the forwards that run the canary (the
                ``step`` of the violation rows it causes); faults start at ``warmup_steps``.
        Returns:
            The faults, to be undone in reverse order after the forward.
        """
        if step < self._warmup_steps:
            return []
        firing = [p for prob, p in self._perturbations if self._rng.random() < prob]
        if not firing:
            return []
        rows = live_rows(forward_batch)
        faults = []
        for perturbation in firing:
            fault = perturbation.inject(forward_batch=forward_batch, rows=rows, rng=self._rng)
            if fault is not None:
                logger.info(fault.log_line(step=step))
                faults.append(fault)
        return faults


def build_fault_injector(
    *, config: PerturbConfig, state: CanaryDeviceState, layer0_keys: object, vocab_size: int
) -> FaultInjector | None:
    """The injector of the perturbations this package implements, or None when none is enabled.

    ``vocab_size`` is the served model's (input tokens stay valid ids when perturbed).
    """
    perturbations: list[tuple[float, Perturbation]] = []
    if config.req_to_token_prob > 0:
        perturbations.append(
            (config.req_to_token_prob, ReqToTokenPerturbation(req_to_token=state.req_to_token))
        )
    if config.real_kv_used_prob > 0:
        perturbations.append(
            (
                config.real_kv_used_prob,
                RealKvUsedPerturbation(req_to_token=state.req_to_token, layer0_keys=layer0_keys),
            )
        )
    if config.input_ids_prob > 0:
        perturbations.append(
            (config.input_ids_prob, InputIdsPerturbation(vocab_size=vocab_size))
        )
    if not perturbations:
        return None
    return FaultInjector(
        warmup_steps=config.warmup_steps, seed=config.seed, perturbations=perturbations
    )
