"""Install the token oracle into a model runner, from the active configuration.

Runs as a BEFORE hook on ``ModelRunner.initialize``, i.e. before that method calls
``create_sampler()`` and ``load_model()``. The oracle's vocabulary is the served model's
(``model_runner.model_config.vocab_size``, the size of the logits). One oracle per process: a
target model runner creates it; an EAGLE draft model runner (``is_draft_worker``), initialized
after its target in the same process, shares the target's, because draft tokens are target
tokens.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang.srt.kv_canary.config import PerturbConfig, get_active_config
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle
from sglang.srt.kv_canary.token_oracle.oracle_manager import TokenOracleManager
from sglang.srt.kv_canary.token_oracle.sampler import (
    TOKEN_ORACLE_BACKEND,
    install_oracle_sampler,
    installed_oracle_manager,
)

logger = logging.getLogger(__name__)

TOKEN_ORACLE_MANAGER_ATTR = "kv_canary_token_oracle_manager"  # attribute of ModelRunner
_ORACLE_VARIABLE = "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE"
_EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})


class TokenOracleSetupError(RuntimeError):
    """The token oracle is enabled in a configuration where it cannot steer the tokens."""


def install_token_oracle_from_env(*, model_runner: Any) -> TokenOracleManager | None:
    """Install the oracle for ``model_runner``; None when the oracle is disabled.

    The configuration comes from :func:`~sglang.srt.kv_canary.config.get_active_config` (read
    from the environment once, at plugin load). The manager is also stored on the model runner
    (:data:`TOKEN_ORACLE_MANAGER_ATTR`; read it with :func:`token_oracle_manager_of`).

    Raises:
        TokenOracleSetupError: the oracle is enabled but ``--sampling-backend`` is not
            ``token_oracle``, or a draft model runner initializes before any target one.
    """
    config = get_active_config()
    if not config.enable_token_oracle:
        return None
    server_args = model_runner.server_args
    if server_args.sampling_backend != TOKEN_ORACLE_BACKEND:
        raise TokenOracleSetupError(
            f"{_ORACLE_VARIABLE}=1 needs --sampling-backend {TOKEN_ORACLE_BACKEND}, got "
            f"{server_args.sampling_backend!r}: with another sampler the tokens do not follow "
            "the oracle"
        )
    if model_runner.is_draft_worker:
        manager = installed_oracle_manager()
        if manager is None:
            raise TokenOracleSetupError(
                "a draft model runner initialized before its target model runner; the token "
                "oracle takes its vocabulary from the target model"
            )
    else:
        manager = install_oracle_sampler(
            oracle=HashOracle(vocab_size=model_runner.model_config.vocab_size),
            perturb=config.perturb,
        )
        _log_installation(manager=manager, server_args=server_args, perturb=config.perturb)
    setattr(model_runner, TOKEN_ORACLE_MANAGER_ATTR, manager)
    return manager


def _log_installation(
    *, manager: TokenOracleManager, server_args: Any, perturb: PerturbConfig
) -> None:
    swap = (
        f"next_token_swap p={perturb.next_token_swap_prob:g} after "
        f"{perturb.warmup_steps} sampler calls, seed {perturb.seed}"
        if perturb.next_token_swap_prob > 0
        else "no next_token_swap"
    )
    logger.info(
        f"KV canary token oracle: sampling backend {TOKEN_ORACLE_BACKEND}, "
        f"vocab_size={manager.oracle.vocab_size}, {swap}"
    )
    eagle_v1 = (server_args.speculative_algorithm in _EAGLE_ALGORITHMS
                and server_args.disable_overlap_schedule)
    if eagle_v1:
        logger.warning(
            "KV canary token oracle: speculative decoding runs the v1 EAGLE worker (overlap "
            "schedule off); its verify step picks tokens from the target logits, so only each "
            "request's first output token (sampled at prefill) follows the oracle. Spec v2 (the "
            "default, overlap on, topk 1) follows the oracle for every token"
        )


def install_token_oracle_before_model_runner_init(
    model_runner: Any, *args: object, **kwargs: object
) -> None:
    """BEFORE ``ModelRunner.initialize``: install the oracle before ``create_sampler()``."""
    install_token_oracle_from_env(model_runner=model_runner)


def token_oracle_manager_of(model_runner: Any) -> TokenOracleManager | None:
    """The manager installed on ``model_runner``, or None when the oracle is off."""
    return getattr(model_runner, TOKEN_ORACLE_MANAGER_ATTR, None)
