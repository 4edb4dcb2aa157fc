"""The oracle's hooks through SGLang's real plugin loader, each case in a fresh interpreter."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=90, suite="kv-canary-cpu")

HERE = pathlib.Path(__file__).resolve().parent
# What the oracle alone wraps (Scheduler.__init__ is needed too, but on a CPU machine its module
# cannot be imported, so SGLang cannot apply hooks to it there).
ORACLE_TARGETS = {
    "sglang.srt.server_args.ServerArgs.add_cli_args",
    "sglang.srt.model_executor.model_runner.ModelRunner.initialize",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch._pad_inputs_to_size",
    "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner.capture_one_batch_size",
    "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner.replay_prepare",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner."
    "capture_one_batch_size",
    "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.replay",
    "sglang.srt.speculative.eagle_info_v2.EagleVerifyInputV2Mixin.sample",
}
# Wrapped for the oracle only, never for the canary alone.
ORACLE_ONLY_TARGETS = {
    "sglang.srt.server_args.ServerArgs.add_cli_args",
    "sglang.srt.model_executor.forward_batch_info.ForwardBatch._pad_inputs_to_size",
    "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner.replay_prepare",
}
# (the EAGLE draft graph and verification hooks serve the canary too: it checks the draft pool
# and keeps owner chains across verifications)

_PROBE = """
    import argparse, json, sys, pkgutil
    from types import SimpleNamespace
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.kv_canary import hook_registration
    from sglang.srt.kv_canary.hook_targets import HOOK_SPECS
    from sglang.srt.server_args import SAMPLING_BACKEND_CHOICES, ServerArgs
    applied = sorted(
        [spec.target, spec.adapter] for spec in HOOK_SPECS
        if hook_registration._wrapper_chain_contains(
            hook_registration._current_function(spec.target), pkgutil.resolve_name(spec.adapter))
    )
    before_parser = "token_oracle" in SAMPLING_BACKEND_CHOICES
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    try:
        parsed = parser.parse_args(["--model-path", "m", "--sampling-backend", "token_oracle"])
        backend = parsed.sampling_backend
    except SystemExit:
        backend = None
    ids = None
    if sys.argv[1:] == ["--run-hooked-batch"]:
        from _batches import FakeReq, model_runner_stub, model_worker_batch, with_canary
        from sglang.srt.model_executor import forward_batch_info
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
        forward_batch_info.enable_num_token_non_padded = lambda: False
        runner = with_canary(model_runner_stub())  # as ModelRunner.initialize's hook leaves it
        runner.attn_backend = SimpleNamespace(get_cuda_graph_seq_len_fill_value=lambda: 1)
        batch = model_worker_batch(mode=ForwardMode.DECODE,
                                   reqs=[FakeReq("a"), FakeReq("b", bootstrap_room=3)],
                                   seq_lens=[4, 5])
        forward_batch = ForwardBatch.init_new(batch, runner)   # the hooked classmethod
        forward_batch._pad_inputs_to_size(runner, 4, 4)        # the hooked padding
        ids = {"rids": forward_batch.rids_int.tolist(),
               "rooms": forward_batch.sampling_info.bootstrap_room_ids_int.tolist()}
    print(json.dumps({"applied": applied, "choices_before_parser": before_parser,
                      "parsed_backend": backend, "ids": ids}))
"""


def _probe(*, run_hooked_batch: bool = False, **env: str) -> dict:
    """Load the plugins in a fresh interpreter with ``env``; report what took effect."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_KV_CANARY_")}
    clean.update(env)
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), clean.get("PYTHONPATH")]))
    command = [sys.executable, "-W", "ignore", "-c", textwrap.dedent(_PROBE)]
    if run_hooked_batch:
        command.append("--run-hooked-batch")
    result = subprocess.run(command, env=clean, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _wrapped_targets(state: dict) -> set[str]:
    """Targets wrapped by one of the package's adapters."""
    return {target for target, _ in state["applied"]}


def test_enabled_oracle_hooks_wrap_their_targets_and_backend_parses() -> None:
    from _oracle_reference import rid_hash

    state = _probe(run_hooked_batch=True, SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE="1")
    assert _wrapped_targets(state) == ORACLE_TARGETS
    assert state["choices_before_parser"] is False  # registered when the parser is built
    assert state["parsed_backend"] == "token_oracle"
    assert state["ids"] == {"rids": [rid_hash("a"), rid_hash("b"), 0, 0], "rooms": [-1, 3, -1, -1]}


def test_disabled_oracle_registers_no_backend() -> None:
    state = _probe()
    assert state["applied"] == []
    assert state["parsed_backend"] is None  # argparse refuses the choice


def test_canary_without_oracle_registers_no_oracle_hook() -> None:
    state = _probe(SGLANG_KV_CANARY_MODE="log")
    assert state["applied"] and _wrapped_targets(state) & ORACLE_ONLY_TARGETS == set()
    assert state["parsed_backend"] is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
