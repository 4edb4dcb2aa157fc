"""The token_oracle sampler, its installation by the model runner's canary, and the EAGLE v2
verify that follows the oracle."""

import logging
import random
import sys
from types import SimpleNamespace

import pytest
import torch

from _batches import (
    VOCAB_SIZE,
    FakeReq,
    forward_batch_from_init_new,
    model_runner_stub,
    model_worker_batch,
    sampler_environment,  # noqa: F401 - fixture
    with_canary,
)
from _oracle_reference import generalized_id, oracle_token
from sglang.srt.kv_canary.config import CanaryConfig, PerturbConfig
from sglang.srt.kv_canary.hooks.eagle import around_verify_sample
from sglang.srt.kv_canary.hooks.forward_batch import after_pad_inputs
from sglang.srt.kv_canary.perturb.next_token_swap import NextTokenSwapState
from sglang.srt.kv_canary.runner import canary_runner
from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner, TokenOracleSetupError
from sglang.srt.kv_canary.runner.kernels import KernelBackend, load_kernels
from sglang.srt.kv_canary.token_oracle.request_ids import MissingRequestIdsError
from sglang.srt.kv_canary.token_oracle import sampler
from sglang.srt.kv_canary.token_oracle.oracle import HashOracle
from sglang.srt.kv_canary.token_oracle.manager import TokenOracleManager
from sglang.srt.layers import sampler as sglang_sampler
from sglang.srt import server_args as sglang_server_args
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")

REQS = [FakeReq("s0"), FakeReq("s1", bootstrap_room=5), FakeReq("s2")]


def _oracle_sampler(next_token_swap=None) -> sampler.OracleSampler:
    manager = TokenOracleManager(oracle=HashOracle(vocab_size=VOCAB_SIZE))
    return sampler.OracleSampler(manager=manager, next_token_swap=next_token_swap)


def _expected(reqs, positions) -> list[int]:
    return [oracle_token(generalized_id(r.rid, r.bootstrap_room), p, VOCAB_SIZE)
            for r, p in zip(reqs, positions)]


def _sample(oracle_sampler, forward_batch, rows: int, *, return_logprob: bool = False,
            logits: torch.Tensor | None = None):
    logits = torch.randn(rows, VOCAB_SIZE) if logits is None else logits
    output = LogitsProcessorOutput(next_token_logits=logits)
    positions = (forward_batch.positions if forward_batch.forward_mode.is_decode()
                 else forward_batch.seq_lens - 1)  # exactly what ModelRunner.sample passes
    tokens = oracle_sampler(output, forward_batch.sampling_info, return_logprob,
                            [0] * rows, [None] * rows, positions)
    return tokens, output


def test_extend_samples_the_oracle_token_after_the_prompt(sampler_environment, monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.EXTEND, reqs=REQS, seq_lens=[3, 8, 5],
                           extend_prefix_lens=[0, 2, 4]),
        monkeypatch=monkeypatch)
    tokens, output = _sample(_oracle_sampler(), forward_batch, 3)
    assert tokens.dtype == torch.int32
    assert tokens.tolist() == _expected(REQS, [3, 8, 5])  # the token at position seq_len
    assert output.next_token_logprobs is None  # nothing computed that was not asked for


def test_decode_samples_position_plus_one(sampler_environment, monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS, seq_lens=[4, 9, 2]),
        monkeypatch=monkeypatch)
    tokens, _ = _sample(_oracle_sampler(), forward_batch, 3)
    assert tokens.tolist() == _expected(REQS, [4, 9, 2])


def test_dp_padded_ids_are_cut_to_the_logits_rows(sampler_environment, monkeypatch) -> None:
    model_runner = with_canary(model_runner_stub())
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS[:2], seq_lens=[4, 9]),
        model_runner=model_runner, monkeypatch=monkeypatch)
    after_pad_inputs(None, forward_batch, model_runner, 4, 4)
    padding = torch.zeros(2, dtype=torch.int64)
    forward_batch.positions = torch.cat([forward_batch.positions, padding])
    tokens, _ = _sample(_oracle_sampler(), forward_batch, 2)
    assert tokens.tolist() == _expected(REQS[:2], [4, 9])


def test_logprobs_are_consistent_with_the_emitted_tokens(sampler_environment, monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS, seq_lens=[4, 9, 2]),
        monkeypatch=monkeypatch)
    logits = torch.randn(3, VOCAB_SIZE)
    tokens, output = _sample(_oracle_sampler(), forward_batch, 3, return_logprob=True,
                             logits=logits.clone())
    reference = torch.log_softmax(logits, dim=-1)[torch.arange(3), tokens.long()]
    torch.testing.assert_close(output.next_token_logprobs, reference)


def test_missing_ids_raise_naming_the_variable(sampler_environment, monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS, seq_lens=[4, 9, 2]),
        monkeypatch=monkeypatch)
    forward_batch.sampling_info = model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS,
                                                     seq_lens=[4, 9, 2]).sampling_info
    with pytest.raises(MissingRequestIdsError, match="SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1"):
        _sample(_oracle_sampler(), forward_batch, 3)


def test_swap_runs_at_the_sampler_exit(sampler_environment, monkeypatch) -> None:
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS[:2], seq_lens=[4, 9]),
        monkeypatch=monkeypatch)
    swap = NextTokenSwapState(probability=1.0, warmup_steps=1, rng=random.Random(0))
    oracle_sampler = _oracle_sampler(next_token_swap=swap)
    expected = _expected(REQS[:2], [4, 9])
    assert _sample(oracle_sampler, forward_batch, 2)[0].tolist() == expected  # warm-up
    assert _sample(oracle_sampler, forward_batch, 2)[0].tolist() == expected[::-1]


def _install(config: CanaryConfig, model_runner: SimpleNamespace) -> CanaryRunner:
    """What ``ModelRunner.initialize``'s hook does for the oracle: the runner's canary installs
    it (the flag refusals and the hook check are a server's, not the oracle's)."""
    runner = CanaryRunner(config=config, model_runner=model_runner,
                          kernels=load_kernels(KernelBackend.TORCH_REFERENCE))
    runner.install_oracle()
    return runner


def test_install_does_nothing_when_disabled(sampler_environment) -> None:
    runner = _install(CanaryConfig(), model_runner_stub())
    assert runner.oracle is None
    assert "token_oracle" not in sglang_sampler._CUSTOM_SAMPLER_FACTORIES


def test_install_builds_the_oracle_from_the_served_vocab(sampler_environment) -> None:
    config = CanaryConfig(enable_token_oracle=True,
                          perturb=PerturbConfig(next_token_swap_prob=1.0, warmup_steps=7))
    target = _install(config, model_runner_stub())
    manager = target.oracle
    assert manager.oracle == HashOracle(vocab_size=VOCAB_SIZE)
    created = sglang_sampler.create_sampler("token_oracle")
    assert isinstance(created, sampler.OracleSampler) and created.manager is manager
    assert created.next_token_swap.probability == 1.0 and created.next_token_swap.warmup_steps == 7


def test_a_draft_runner_keeps_its_own_oracle_and_leaves_the_sampler_alone(
    sampler_environment,
) -> None:
    """Changed behaviour: an EAGLE draft model runner no longer shares its target's manager; it
    builds its own (for its checks) from the same vocabulary, also when it initializes first, and
    never replaces the sampler (its tokens never go through it)."""
    config = CanaryConfig(enable_token_oracle=True)
    draft_first = _install(config, model_runner_stub(is_draft_worker=True))
    assert draft_first.oracle.oracle == HashOracle(vocab_size=VOCAB_SIZE)
    assert "token_oracle" not in sglang_sampler._CUSTOM_SAMPLER_FACTORIES
    target = _install(config, model_runner_stub())
    draft = _install(config, model_runner_stub(is_draft_worker=True))
    assert draft.oracle is not target.oracle and draft.oracle.oracle == target.oracle.oracle
    assert sglang_sampler.create_sampler("token_oracle").manager is target.oracle


def test_install_refuses_another_sampling_backend(sampler_environment) -> None:
    with pytest.raises(TokenOracleSetupError, match="--sampling-backend token_oracle"):
        _install(CanaryConfig(enable_token_oracle=True),
                 model_runner_stub(sampling_backend="flashinfer"))


def test_install_warns_about_eagle_v1(sampler_environment, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=canary_runner.__name__):
        _install(CanaryConfig(enable_token_oracle=True), model_runner_stub(
            speculative_algorithm="EAGLE", disable_overlap_schedule=True))
    assert "first output token" in caplog.text


def test_backend_choice_without_an_installed_oracle_fails_clearly(sampler_environment) -> None:
    sampler.register_oracle_backend_choice()  # what the CLI process does
    assert "token_oracle" in sglang_server_args.SAMPLING_BACKEND_CHOICES
    with pytest.raises(RuntimeError, match="no model runner installed the token oracle"):
        sglang_sampler.create_sampler("token_oracle")


# ----------------------------------------------------------------------------- EAGLE v2 verify

def _greedy_chain_sample(verify_input, batch, logits_output, vocab_mask=None):
    """Stand-in for EagleVerifyInputV2Mixin.sample with topk 1: argmax per verified token."""
    return torch.argmax(logits_output.next_token_logits, dim=-1)


def test_eagle_verify_follows_the_oracle_and_restores_the_logits(sampler_environment,
                                                                 monkeypatch) -> None:
    seq_lens, block = [4, 10], 3
    forward_batch = forward_batch_from_init_new(  # the verify batch's ids live on sampling_info
        model_worker_batch(mode=ForwardMode.DECODE, reqs=REQS[:2], seq_lens=seq_lens),
        monkeypatch=monkeypatch)
    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY,
                            seq_lens=forward_batch.seq_lens,
                            sampling_info=forward_batch.sampling_info)
    positions = [s + j for s in seq_lens for j in range(block)]
    verify_input = SimpleNamespace(draft_token_num=block,
                                   positions=torch.tensor(positions, dtype=torch.int64))
    real_logits = torch.randn(len(positions), VOCAB_SIZE)
    output = LogitsProcessorOutput(next_token_logits=real_logits)
    # the adapter finds the model runner's canary through the batch's carrier
    predicted = around_verify_sample(_greedy_chain_sample, verify_input, batch, output)
    reqs = [REQS[0]] * block + [REQS[1]] * block
    assert predicted.tolist() == _expected(reqs, [p + 1 for p in positions])
    assert output.next_token_logits is real_logits


def test_eagle_verify_of_an_idle_batch_is_untouched(sampler_environment, monkeypatch) -> None:
    """An IDLE verify batch (DP attention) has no rows: the original sample runs as it is."""
    forward_batch = forward_batch_from_init_new(
        model_worker_batch(mode=ForwardMode.IDLE, reqs=[], seq_lens=[]), monkeypatch=monkeypatch)
    output = LogitsProcessorOutput(next_token_logits=torch.randn(3, VOCAB_SIZE))
    batch = SimpleNamespace(forward_mode=ForwardMode.IDLE, seq_lens=torch.tensor([4]),
                            sampling_info=forward_batch.sampling_info)
    predicted = around_verify_sample(
        _greedy_chain_sample, SimpleNamespace(draft_token_num=3, positions=None), batch, output)
    assert predicted.tolist() == torch.argmax(output.next_token_logits, dim=-1).tolist()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
