"""Hook that snapshots each forward's token histories (target in :mod:`..hook_targets`).

AFTER ``ForwardBatch.init_new(batch, model_runner)`` (a classmethod: the hook receives the new
ForwardBatch, the class, then the call's arguments, ``batch`` possibly as a keyword): the
requests of ``batch.reqs`` (``ModelWorkerBatch.reqs`` in 0.5.12.post1) are snapshotted onto the
ForwardBatch (:meth:`~.checks.TokenChecks.snapshot`: ``req_all_ids_info``, only what the runner's
pool does not hold yet, in one pinned buffer). ``CanaryRuntime.run_step`` copies and scatters it
before the forward. Host work only; no device sync.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.kv_canary.runtime import runtime_of


def attach_token_history_after_init_new(
    forward_batch: Any, forward_batch_class: type, *args: Any, **kwargs: Any
) -> None:
    """AFTER ``ForwardBatch.init_new(batch, model_runner)``.

    Raises:
        RuntimeError: the runner's canary keeps no token history (installation mismatch).
        ValueError: ``batch.reqs`` is missing or does not have one request per row, or a request
            has no ``req_pool_idx``.
    """
    batch = args[0] if args else kwargs["batch"]
    model_runner = args[1] if len(args) > 1 else kwargs["model_runner"]
    token_checks = runtime_of(model_runner).token_checks
    if token_checks is None:
        raise RuntimeError(
            "KV canary token checks: the ForwardBatch.init_new hook is registered but this "
            "ModelRunner's canary keeps no token history"
        )
    reqs = batch.reqs
    if reqs is None or len(reqs) != forward_batch.batch_size:
        count = "no" if reqs is None else len(reqs)
        raise ValueError(
            f"KV canary token checks: the batch has {forward_batch.batch_size} rows but {count} "
            "requests (ModelWorkerBatch.reqs); the token history needs one request per row"
        )
    token_checks.snapshot(forward_batch=forward_batch, reqs=reqs)
