"""Seeded, warmed-up choice of the perturbations of each forward step.

Four injection points, all on the host and outside graphs, never synchronizing:

* before the forward (:meth:`FaultInjector.before_forward`): ``req_to_token``,
  ``foreign_prefix``, ``real_kv_used``, ``input_ids``, ``seq_lens`` (undone right after the
  forward);
* inside an eager forward, after the pre launch (:meth:`FaultInjector.inside_forward`):
  ``lost_write`` (undone before the post launch);
* after the forward (:meth:`FaultInjector.after_forward`): ``real_kv_post_forward`` (kept);
* when a radix sweep pass starts (:meth:`FaultInjector.before_sweep_pass`):
  ``real_kv_unused_cache`` (kept).
"""

from __future__ import annotations

import logging
import random
from typing import Any

from sglang.jit_kernel.kv_canary.kernel_inputs import CanaryDeviceState
from sglang.srt.kv_canary.config import PerturbConfig
from sglang.srt.kv_canary.perturb.fault import InjectedFault, Perturbation
from sglang.srt.kv_canary.perturb.foreign_prefix import ForeignPrefixPerturbation
from sglang.srt.kv_canary.perturb.input_ids import InputIdsPerturbation
from sglang.srt.kv_canary.perturb.kv_bytes import FingerprintedBytes
from sglang.srt.kv_canary.perturb.live_rows import live_rows
from sglang.srt.kv_canary.perturb.lost_write import LostWritePerturbation
from sglang.srt.kv_canary.perturb.real_kv_post_forward import RealKvPostForwardPerturbation
from sglang.srt.kv_canary.perturb.real_kv_unused_cache import RealKvUnusedCachePerturbation
from sglang.srt.kv_canary.perturb.real_kv_used import RealKvUsedPerturbation
from sglang.srt.kv_canary.perturb.req_to_token import ReqToTokenPerturbation
from sglang.srt.kv_canary.perturb.seq_lens import SeqLensPerturbation
from sglang.srt.kv_canary.perturb.window_table import WindowTablePerturbation
from sglang.srt.kv_canary.pools.seam import CanaryPool

logger = logging.getLogger(__name__)


class FaultInjector:
    """Draws, per injection point after the warm-up, whether each perturbation fires.

    The draws come from one ``random.Random(seed)``: the same sequence of batches gets the same
    faults. Every injected fault is logged at INFO as one ``kv_canary perturb:`` line.
    """

    def __init__(
        self,
        *,
        warmup_steps: int,
        seed: int,
        before_forward: list[tuple[float, Perturbation]],
        after_forward: list[tuple[float, Perturbation]] = (),
        inside_forward: list[tuple[float, Perturbation]] = (),
        unused_cache: tuple[float, RealKvUnusedCachePerturbation] | None = None,
    ) -> None:
        self._warmup_steps = warmup_steps
        self._rng = random.Random(seed)
        self._before = list(before_forward)
        self._after = list(after_forward)
        self._inside = list(inside_forward)
        self._unused_cache = unused_cache

    def before_forward(self, *, forward_batch: object, step: int) -> list[InjectedFault]:
        """Inject this step's faults before the forward.

        Args:
            forward_batch: the live (non-idle) batch ``ModelRunner.forward`` received.
            step: 0-based index of this forward among the forwards with request rows (the
                ``step`` of the violation rows it causes); faults start at ``warmup_steps``.
        Returns:
            The faults, to be undone in reverse order after the forward.
        """
        return self._inject(self._before, forward_batch=forward_batch, step=step)

    def inside_forward(
        self, *, forward_batch: object, live_batch: object, step: int
    ) -> list[InjectedFault]:
        """Inject this step's faults between the pre launch and the model (an eager forward);
        undone, in reverse order, before the post launch.

        Args:
            forward_batch: the batch the model runs (padded past the live rows, as a CUDA graph
                or DP attention pads it).
            live_batch: the batch ``ModelRunner.forward`` received: its rows are the targets.
        """
        return self._inject(self._inside, forward_batch=forward_batch, step=step,
                            rows_of=live_batch)

    def after_forward(self, *, forward_batch: object, step: int) -> list[InjectedFault]:
        """Inject this step's after-forward faults (kept: nothing to undo)."""
        return self._inject(self._after, forward_batch=forward_batch, step=step)

    def before_sweep_pass(self, *, tree_cache: Any, step: int) -> InjectedFault | None:
        """Maybe corrupt an unused cached slot as a sweep pass starts (kept)."""
        if self._unused_cache is None or step < self._warmup_steps:
            return None
        probability, perturbation = self._unused_cache
        if self._rng.random() >= probability:
            return None
        fault = perturbation.inject_into_cache(tree_cache=tree_cache, rng=self._rng)
        if fault is not None:
            logger.info(fault.log_line(step=step))
        return fault

    def _inject(
        self, perturbations: list[tuple[float, Perturbation]], *, forward_batch: object, step: int,
        rows_of: object | None = None,
    ) -> list[InjectedFault]:
        if step < self._warmup_steps or not perturbations:
            return []
        firing = [p for prob, p in perturbations if self._rng.random() < prob]
        if not firing:
            return []
        rows = live_rows(forward_batch if rows_of is None else rows_of)
        faults = []
        for perturbation in firing:
            fault = perturbation.inject(forward_batch=forward_batch, rows=rows, rng=self._rng,
                                        step=step)
            if fault is not None:
                logger.info(fault.log_line(step=step))
                faults.append(fault)
        return faults


def build_fault_injector(
    *, config: PerturbConfig, state: CanaryDeviceState, pool: CanaryPool, vocab_size: int
) -> FaultInjector | None:
    """The injector of the enabled KV-side perturbations, or None when none is enabled.

    ``vocab_size`` is the served model's (input tokens stay valid ids when perturbed).
    """
    kv_bytes = (
        FingerprintedBytes(pool=pool, real_data=state.real_data, sub_pool=config.kv_sub_pool)
        if config.real_kv_used_prob or config.real_kv_post_forward_prob
        or config.real_kv_unused_cache_prob
        else None
    )
    before: list[tuple[float, Perturbation]] = []
    if config.req_to_token_prob > 0:
        before.append(
            (config.req_to_token_prob, ReqToTokenPerturbation(req_to_token=state.req_to_token))
        )
    if config.foreign_prefix_prob > 0:
        before.append((
            config.foreign_prefix_prob,
            ForeignPrefixPerturbation(req_to_token=state.req_to_token, records=state.records),
        ))
    if config.real_kv_used_prob > 0:
        before.append((
            config.real_kv_used_prob,
            RealKvUsedPerturbation(req_to_token=state.req_to_token, kv_bytes=kv_bytes),
        ))
    if config.window_table_prob > 0:
        if state.window is None:
            raise ValueError(
                f"SGLANG_KV_CANARY_PERTURB_WINDOW_TABLE_PROB={config.window_table_prob:g} needs "
                f"a hybrid sliding-window pool, but the KV pool is {pool.kind}"
            )
        before.append((
            config.window_table_prob,
            WindowTablePerturbation(req_to_token=state.req_to_token,
                                    slot_table=state.window.slot_table,
                                    window=state.window.window),
        ))
    if config.input_ids_prob > 0:
        before.append((config.input_ids_prob, InputIdsPerturbation(vocab_size=vocab_size)))
    if config.seq_lens_prob > 0:
        before.append((config.seq_lens_prob, SeqLensPerturbation()))
    after: list[tuple[float, Perturbation]] = []
    if config.real_kv_post_forward_prob > 0:
        after.append((
            config.real_kv_post_forward_prob, RealKvPostForwardPerturbation(kv_bytes=kv_bytes)
        ))
    inside = (
        [(config.lost_write_prob, LostWritePerturbation())] if config.lost_write_prob > 0 else []
    )
    unused_cache = (
        (config.real_kv_unused_cache_prob, RealKvUnusedCachePerturbation(kv_bytes=kv_bytes,
                                                                     pool=pool))
        if config.real_kv_unused_cache_prob > 0
        else None
    )
    if not before and not after and not inside and unused_cache is None:
        return None
    return FaultInjector(
        warmup_steps=config.warmup_steps, seed=config.seed, before_forward=before,
        after_forward=after, inside_forward=inside, unused_cache=unused_cache,
    )
