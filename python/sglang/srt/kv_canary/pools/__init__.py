"""The pool seam (:mod:`.seam`) and its implementations: :func:`canary_pool_for` picks the one for
a model runner's pools or refuses them with the reason and what to change.

Implementations: :class:`.mha.MHACanaryPool` (``MHATokenToKVPool``, bf16/fp16 or FP8),
:class:`.mha.MHAFP4CanaryPool` (``MHATokenToKVPoolFP4``), :class:`.mla.MLACanaryPool`
(``MLATokenToKVPool``, bf16 or FP8) and :class:`.swa.SWACanaryPool` (the hybrid sliding-window
``SWAKVPool``). Every other pool type is refused at start-up (:data:`POOL_ADVICE` says why and
what to change); a new pool type adds its implementation to :data:`CANARY_POOL_TYPES`, and
nothing else in the runner changes.
"""

from __future__ import annotations

from sglang.srt.kv_canary.errors import CanaryUnsupportedError
from sglang.srt.kv_canary.pools.mha import MHACanaryPool, MHAFP4CanaryPool
from sglang.srt.kv_canary.pools.mla import MLACanaryPool
from sglang.srt.kv_canary.pools.seam import CanaryPool, PoolContext
from sglang.srt.kv_canary.pools.swa import WINDOW_OWNER_BYTES, SWACanaryPool

CANARY_POOL_TYPES = (MHACanaryPool, MHAFP4CanaryPool, MLACanaryPool, SWACanaryPool)

# Pool classes without an implementation, with why and what to change.
POOL_ADVICE: dict[str, str] = {
    "NoOpMHATokenToKVPool": "it stores no KV; remove --prefill-only-disable-kv-cache",
    "MLATokenToKVPoolFP4": (
        "its scale rows (kv_cache_dim / 16 bytes, 36 for DeepSeek) are not whole 8-byte words and "
        "its attention backends need Blackwell; use --kv-cache-dtype fp8_e4m3 or the default"
    ),
    "NSATokenToKVPool": (
        "NSA models (DeepSeek V3.2 attention) keep an indexer cache beside the latent, which "
        "the canary does not cover yet"
    ),
    "HybridLinearKVPool": "hybrid linear-attention / mamba models are not supported yet",
    "DeepSeekV4TokenToKVPool": (
        "DeepSeek V4's compressed pools (per-layer compression ratios, several slot spaces) are "
        "not covered yet"
    ),
}


def pool_refusals(*, req_to_token_pool: object, token_to_kv_pool: object) -> list[str]:
    """Reasons the canary cannot keep records beside these pools; empty when both are covered
    (the request pool must be SGLang's plain ``ReqToTokenPool``)."""
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

    reasons: list[str] = []
    if not any(pool_type.accepts(token_to_kv_pool) for pool_type in CANARY_POOL_TYPES):
        name = type(token_to_kv_pool).__name__
        covered = ", ".join(pool_type.kind for pool_type in CANARY_POOL_TYPES)
        advice = POOL_ADVICE.get(name, "it has no canary implementation")
        if name == SWACanaryPool.kind:
            advice = SWACanaryPool.refusal(token_to_kv_pool)
        reasons.append(
            f"the KV pool is {name}, but the canary covers {covered} only: {advice}"
        )
    if type(req_to_token_pool) is not ReqToTokenPool:
        reasons.append(
            f"the request pool is {type(req_to_token_pool).__name__}, but the canary supports "
            "ReqToTokenPool only (mamba / PD-decode request pools are not supported yet)"
        )
    return reasons


def canary_pool_for(
    *, req_to_token_pool: object, token_to_kv_pool: object, context: PoolContext,
) -> CanaryPool:
    """The :class:`~.seam.CanaryPool` of a model runner's pools (``context``: what the model
    runner knows beside them).

    Raises:
        CanaryUnsupportedError: :func:`pool_refusals` found a reason, or the implementation
            refused the context (a hybrid pool without a sliding window, an MLA pool read by an
            untested attention backend).
    """
    reasons = pool_refusals(req_to_token_pool=req_to_token_pool,
                            token_to_kv_pool=token_to_kv_pool)
    if reasons:
        raise CanaryUnsupportedError(reasons)
    pool_type = next(t for t in CANARY_POOL_TYPES if t.accepts(token_to_kv_pool))
    try:
        return pool_type.build(token_to_kv_pool, context=context)
    except ValueError as error:
        raise CanaryUnsupportedError([str(error)]) from error


def record_bytes_per_kv_token() -> int:
    """Record bytes per KV token of the pools SGLang sizes with its ``DefaultPoolConfigurator``
    (MHA, FP4 MHA and MLA pools: one record per slot each): what the memory hook adds to the
    cell size before the pool exists."""
    return MHACanaryPool.record_bytes_per_token()


def hybrid_swa_token_bytes(*, swa_full_tokens_ratio: float) -> float:
    """Canary bytes per full-attention token of a hybrid sliding-window pool (SGLang sizes it
    with ``HybridSWAPoolConfigurator``, whose cell is per full token): a record, and the owner
    bytes of the ``swa_full_tokens_ratio`` SWA tokens sized per full token."""
    return MHACanaryPool.record_bytes_per_token() + swa_full_tokens_ratio * WINDOW_OWNER_BYTES


def extra_record_rows(*, page_size: int) -> int:
    """Record rows such a pool has beyond its token capacity (its padding page)."""
    return MHACanaryPool.extra_record_rows(page_size=page_size)
