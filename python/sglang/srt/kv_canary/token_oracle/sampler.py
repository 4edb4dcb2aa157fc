"""The ``token_oracle`` sampling backend.

Registered through SGLang 0.5.12's ``sglang.srt.layers.sampler.register_sampler_backend``, which
also adds the name to ``server_args.SAMPLING_BACKEND_CHOICES`` (the ``--sampling-backend``
argparse choices). Registration happens twice per deployment, both idempotent:

* in the CLI process, before the parser is built (BEFORE hook on ``ServerArgs.add_cli_args``),
  so ``--sampling-backend token_oracle`` parses;
* in each scheduler process by :func:`install_oracle_sampler`, before ``ModelRunner.initialize``
  calls ``create_sampler()``.

:class:`OracleSampler` ignores the logits: each row's token is the oracle's token after the
sampled position, then the optional next-token-swap perturbation. It computes nothing else
unless logprobs are requested, in which case the logprobs are the model's ``log_softmax`` of
the raw logits (temperature, top-p/k and penalties are ignored), read at the oracle's tokens, so
logprob requests get values consistent with the emitted tokens. Grammar masks, logit processors,
NaN detection and the cross-rank token sync do not apply: the oracle is deterministic per
(request id, position), so every TP rank emits the same tokens.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sglang.srt.kv_canary.config import PerturbConfig
from sglang.srt.kv_canary.perturb.next_token_swap import (
    SAMPLED_ROWS_ATTR,
    NextTokenSwapState,
    maybe_perturb_swap_next_tokens,
)
from sglang.srt.kv_canary.request_ids import generalized_req_ids_of
from sglang.srt.kv_canary.token_oracle.oracle import TokenOracle
from sglang.srt.kv_canary.token_oracle.oracle_manager import TokenOracleManager
from sglang.srt.layers.sampler import Sampler, register_sampler_backend

if TYPE_CHECKING:
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

logger = logging.getLogger(__name__)

TOKEN_ORACLE_BACKEND = "token_oracle"


class OracleSampler(Sampler):
    """A ``Sampler`` whose tokens come from a :class:`TokenOracleManager`."""

    def __init__(
        self, *, manager: TokenOracleManager, next_token_swap: NextTokenSwapState | None
    ) -> None:
        super().__init__()
        self.manager = manager
        self.next_token_swap = next_token_swap

    def forward(
        self,
        logits_output: LogitsProcessorOutput,
        sampling_info: SamplingBatchInfo,
        return_logprob: bool,
        top_logprobs_nums: list[int],
        token_ids_logprobs: list[list[int]],
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """The 0.5.12 ``Sampler.forward`` contract: int32 ``[rows]`` next tokens.

        ``rows`` is the number of logits rows; the ids and ``positions`` may be longer
        (DP-attention padding) and are cut to it.

        Raises:
            MissingRequestIdsError: ``sampling_info`` has no per-request ids (names
                SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE).
            ValueError: fewer ids or positions than logits rows.
        """
        logits = logits_output.next_token_logits
        rows = logits.shape[0]
        generalized_req_ids = generalized_req_ids_of(sampling_info)
        if generalized_req_ids.shape[0] < rows or positions.shape[0] < rows:
            raise ValueError(
                f"token_oracle sampler: {rows} logits rows but {generalized_req_ids.shape[0]} "
                f"request ids and {positions.shape[0]} positions"
            )
        next_token_ids = self.manager.sample_next_tokens(
            generalized_req_ids=generalized_req_ids[:rows], logits_positions=positions[:rows]
        )
        if self.next_token_swap is not None:
            next_token_ids = maybe_perturb_swap_next_tokens(
                next_token_ids=next_token_ids,
                sampled_rows=getattr(sampling_info, SAMPLED_ROWS_ATTR, None),
                state=self.next_token_swap,
            )
        if return_logprob:
            self._attach_logprobs_to_output(
                logits_output,
                torch.log_softmax(logits.float(), dim=-1),
                top_logprobs_nums,
                token_ids_logprobs,
                sampling_info,
                next_token_ids,
            )
        return next_token_ids


@dataclass(frozen=True, slots=True, kw_only=True)
class _Installation:
    manager: TokenOracleManager
    perturb: PerturbConfig


_installation: _Installation | None = None
_backend_registered = False


def _create_oracle_sampler() -> OracleSampler:
    """The factory ``create_sampler()`` calls for ``--sampling-backend token_oracle``."""
    if _installation is None:
        raise RuntimeError(
            f"the {TOKEN_ORACLE_BACKEND!r} sampling backend was requested before the token oracle "
            "was installed in this process (install_oracle_sampler runs from the "
            "ModelRunner.initialize hook when SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1)"
        )
    return OracleSampler(
        manager=_installation.manager,
        next_token_swap=NextTokenSwapState.from_config(_installation.perturb),
    )


def register_token_oracle_backend() -> None:
    """Register the ``token_oracle`` backend with SGLang once per process."""
    global _backend_registered
    if not _backend_registered:
        register_sampler_backend(TOKEN_ORACLE_BACKEND, _create_oracle_sampler)
        _backend_registered = True


def register_backend_before_cli_parsing(*args: object, **kwargs: object) -> None:
    """BEFORE ``ServerArgs.add_cli_args``: make ``--sampling-backend token_oracle`` parse."""
    register_token_oracle_backend()


def install_oracle_sampler(
    *, oracle: TokenOracle, perturb: PerturbConfig = PerturbConfig()
) -> TokenOracleManager:
    """Make ``oracle`` the token source of every ``token_oracle`` sampler created from now on.

    Args:
        oracle: the oracle (its vocabulary is the served model's).
        perturb: the fault-injection settings; ``next_token_swap_prob > 0`` gives each sampler
            its own :class:`NextTokenSwapState`.
    Returns:
        The manager the samplers (and the in-forward checks) share.
    """
    global _installation
    manager = TokenOracleManager(oracle=oracle)
    _installation = _Installation(manager=manager, perturb=perturb)
    register_token_oracle_backend()
    return manager


def installed_oracle_manager() -> TokenOracleManager | None:
    """The manager of the last :func:`install_oracle_sampler` in this process, if any."""
    return None if _installation is None else _installation.manager
