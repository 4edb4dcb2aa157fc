"""The ``token_oracle`` sampling backend.

Registered through SGLang 0.5.12's ``sglang.srt.layers.sampler.register_sampler_backend``, which
also adds the name to ``server_args.SAMPLING_BACKEND_CHOICES`` (the ``--sampling-backend``
argparse choices). Registration happens twice per deployment, both idempotent:

* in the CLI process, before the parser is built (BEFORE hook on ``ServerArgs.add_cli_args``),
  so ``--sampling-backend token_oracle`` parses;
* in each scheduler process by the target model runner's canary (:func:`register_oracle_sampler`
  with a factory bound to that runner's oracle), before ``ModelRunner.initialize`` calls
  ``create_sampler()``. SGLang's sampler registry holds the factory; this module keeps no state.

:class:`OracleSampler` ignores the logits: each row's token is the oracle's token after the
sampled position (for a batch replayed from a decode CUDA graph, computed inside that graph and
taken from :class:`~.graph_tokens.GraphOracleTokens`), then the optional next-token-swap
perturbation. It computes nothing else
unless logprobs are requested, in which case the logprobs are the model's ``log_softmax`` of
the raw logits (temperature, top-p/k and penalties are ignored), read at the oracle's tokens, so
logprob requests get values consistent with the emitted tokens. Grammar masks, logit processors,
NaN detection and the cross-rank token sync do not apply: the oracle is deterministic per
(request id, position), so every TP rank emits the same tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.srt.kv_canary.perturb.next_token_swap import (
    NextTokenSwapState,
    maybe_perturb_swap_next_tokens,
)
from sglang.srt.kv_canary.batch.carrier import batch_inputs_of
from sglang.srt.kv_canary.token_oracle.graph_tokens import GraphOracleTokens
from sglang.srt.kv_canary.token_oracle.request_ids import request_ids_of
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.layers.sampler import Sampler, register_sampler_backend

if TYPE_CHECKING:
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

logger = logging.getLogger(__name__)

TOKEN_ORACLE_BACKEND = "token_oracle"


class OracleSampler(Sampler):
    """A ``Sampler`` whose tokens come from a :class:`TokenOracleManager`."""

    def __init__(
        self,
        *,
        manager: TokenOracleManager,
        next_token_swap: NextTokenSwapState | None,
        graph_tokens: GraphOracleTokens | None = None,
    ) -> None:
        super().__init__()
        self.manager = manager
        self.next_token_swap = next_token_swap
        self.graph_tokens = graph_tokens

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
        next_token_ids = (
            None if self.graph_tokens is None
            else self.graph_tokens.take(sampling_info=sampling_info, rows=rows)
        )
        if next_token_ids is None:  # not a replayed decode graph: launch the oracle here
            rids_int, rooms = request_ids_of(sampling_info)
            if rids_int.shape[0] < rows or positions.shape[0] < rows:
                raise ValueError(
                    f"token_oracle sampler: {rows} logits rows but {rids_int.shape[0]} "
                    f"request ids and {positions.shape[0]} positions"
                )
            next_token_ids = self.manager.sample_next_tokens_by_request(
                rids_int=_first(rids_int, rows), bootstrap_room_ids_int=_first(rooms, rows),
                logits_positions=_first(positions, rows),
            )
        if self.next_token_swap is not None:
            next_token_ids = maybe_perturb_swap_next_tokens(
                next_token_ids=next_token_ids,
                sampled_rows=_sampled_rows_of(sampling_info),
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


def _first(values: torch.Tensor, rows: int) -> torch.Tensor:
    """``values[:rows]``, without a new view when it already has ``rows`` entries."""
    return values if values.shape[0] == rows else values[:rows]


def _sampled_rows_of(sampling_info: object):
    inputs = batch_inputs_of(sampling_info)
    return None if inputs is None else inputs.sampled_rows


def register_oracle_backend_choice() -> None:
    """Make ``--sampling-backend token_oracle`` a valid choice in this process (the CLI process
    parses it). A sampler created from this registration raises: in a scheduler process the
    model runner's canary registers the real factory before ``create_sampler()`` runs."""
    if TOKEN_ORACLE_BACKEND not in _registered_choices():
        register_sampler_backend(TOKEN_ORACLE_BACKEND, _refuse_unbound_sampler)


def register_oracle_sampler(*, factory: Callable[[], OracleSampler]) -> None:
    """Make ``create_sampler()`` build ``factory()`` for ``--sampling-backend token_oracle``."""
    register_sampler_backend(TOKEN_ORACLE_BACKEND, factory)


def _registered_choices() -> set[str]:
    from sglang.srt.server_args import SAMPLING_BACKEND_CHOICES

    return SAMPLING_BACKEND_CHOICES


def _refuse_unbound_sampler() -> OracleSampler:
    raise RuntimeError(
        f"the {TOKEN_ORACLE_BACKEND!r} sampling backend was requested in a process where no "
        "model runner installed the token oracle (it is installed by the ModelRunner.initialize "
        "hook when SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1)"
    )
