"""The benchmark harness (``benchmark/harness``) without a server or a GPU: spreads and paired
ratios, the table, the deadline, option parsing (every script's bad options exit 2 naming the
option), targets, the result-set writer, the configurations
and their server flags, workload payloads and the streamed-answer timing, what a server log says,
and the interleaved rounds (order, pairing, budget, failures)."""

import argparse
import importlib
import json
import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="kv-canary-cpu")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmark"))

from harness import options  # noqa: E402
from harness.configs import (  # noqa: E402
    CANARY_CONFIGS,
    CANARY_FLAGS,
    CONFIGS,
    FLAGS_BASELINE,
    STOCK,
)
from harness.deadline import Deadline  # noqa: E402
from harness.interleave import Participant, measure_interleaved, rotated  # noqa: E402
from harness.models import (  # noqa: E402
    CONTEXT_LENGTH,
    DEFAULT_MODELS,
    GPT_OSS,
    HYBRID_FULL_POOL_TOKENS,
    KV_POOL_TOKENS,
    MODELS,
    SWA_FULL_TOKENS_RATIO,
    ModelShape,
    make_model,
)
from harness.results import write_result_set  # noqa: E402
from harness.servers import (  # noqa: E402
    COMMON_ARGS,
    MACHINE_ARGS,
    PoolLimits,
    ServerSpec,
    misfit,
    pool_problem,
    read_log_report,
    read_pool_limits,
    refusal_reason,
    server_args,
)
from harness.stats import Spread, paired_ratios, spread  # noqa: E402
from harness.table import Table, ratio_cell, value_cell  # noqa: E402
from harness.targets import Target, Verdict  # noqa: E402
from harness.workloads import (  # noqa: E402
    WORKLOADS,
    RoundTiming,
    StreamCollector,
    StreamError,
    round_payload,
)


# ----------------------------------------------------------------------------- stats and table

def test_a_spread_is_the_median_with_its_quartiles_and_ratios_pair_rounds() -> None:
    figure = spread([3.0, 1.0, 2.0, 10.0])
    assert (figure.median, figure.q1, figure.q3) == (2.5, 1.75, 4.75)
    assert (figure.low, figure.high, figure.samples) == (1.0, 10.0, 4)
    # the stray 10.0 does not widen the printed interval: median ± half the IQR
    assert figure.half_width == 1.5 and figure.contains(4.0) and not figure.contains(4.1)
    assert spread([7.0]).half_width == 0.0 and spread([7.0]).contains(7.0)
    assert figure.scaled(2.0).to_json() == {"median": 5.0, "q1": 3.5, "q3": 9.5, "low": 2.0,
                                            "high": 20.0, "samples": 4}
    ratios = paired_ratios(numerators=[2.0, 4.0, 9.0], denominators=[1.0, 4.0, 3.0])
    assert (ratios.median, ratios.low, ratios.high) == (2.0, 1.0, 3.0)
    with pytest.raises(ValueError, match="one length"):
        paired_ratios(numerators=[1.0], denominators=[1.0, 2.0])
    with pytest.raises(ValueError, match="non-zero"):
        paired_ratios(numerators=[1.0], denominators=[0.0])
    with pytest.raises(ValueError, match="at least one"):
        spread([])
    with pytest.raises(ValueError, match="low <= q1 <= median <= q3 <= high"):
        Spread(median=5.0, q1=1.0, q3=2.0, low=1.0, high=2.0, samples=2)


def test_the_table_aligns_labels_left_and_figures_right() -> None:
    table = Table(header=("name", "x", "value"), rows=(("a", "b", "1.0"), ("long", "c", "10.25")),
                  label_columns=2)
    assert table.render().splitlines() == ["name  x  value", "a     b    1.0",
                                           "long  c  10.25"]
    assert value_cell(spread([9.0, 10.0, 11.0]), digits=1) == "10.0 ±5.0%"  # quartiles 9.5, 10.5
    assert ratio_cell(spread([0.99, 1.0, 1.03])) == "1.000 ±0.010"
    assert value_cell(None, digits=1) == ratio_cell(None) == "-"
    with pytest.raises(ValueError, match="2 cells"):
        Table(header=("a", "b", "c"), rows=(("x", "y"),))


def test_the_deadline_counts_down_on_its_clock() -> None:
    now = [100.0]
    deadline = Deadline.after(10.0, clock=lambda: now[0])
    now[0] = 104.0
    assert deadline.remaining_s() == 6.0 and deadline.allows(6.0) and not deadline.allows(6.1)
    assert deadline.earlier_by(2.0).remaining_s() == 4.0
    assert deadline.capped_at(deadline.earlier_by(1.0)).remaining_s() == 5.0
    with pytest.raises(ValueError, match="allowed: > 0"):
        Deadline.after(0.0)


@pytest.mark.parametrize(("parse", "value", "message"), [
    (options.names(option="--models", allowed=("tiny", "8b")), "tiny,70b",
     "--models='tiny,70b' is invalid; allowed: a comma-separated list of tiny, 8b"),
    (options.names(option="--models", allowed=("tiny",)), " , ", "--models=' , ' is invalid"),
    (options.integer(option="--rounds", minimum=1), "0",
     "--rounds='0' is invalid; allowed: an integer >= 1"),
    (options.integer(option="--rounds", minimum=1), "x", "--rounds='x' is invalid"),
    (options.seconds(option="--time-budget-s"), "-3",
     "--time-budget-s='-3' is invalid; allowed: a number of seconds > 0"),
])
def test_options_name_the_option_the_value_and_what_is_allowed(parse, value, message) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse(value)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(("script", "argv", "message"), [
    ("bench_server", ["--configs", "off,canary"], "a list that names stock"),
    ("bench_server", ["--models", "70b"],
     "--models='70b' is invalid; allowed: a comma-separated list of tiny, 8b, tiny-swa"),
    ("bench_server", ["--workloads", "decode128"], "--workloads='decode128' is invalid"),
    ("bench_server", ["--max-rounds", "0"],
     "--max-rounds='0' is invalid; allowed: an integer >= 1"),
    ("bench_server", ["--time-budget-s", "0"], "--time-budget-s='0' is invalid"),
    ("bench_host", ["--modes", "decode2"], "--modes='decode2' is invalid"),
    ("bench_host", ["--configs", "off"],
     "--configs='off' is invalid; allowed: a comma-separated list of canary, all-checks"),
    ("bench_host", ["--rounds", "0"], "--rounds='0' is invalid; allowed: an integer >= 1"),
    ("bench_kernels", ["--checks", "partial,everything"],
     "--checks='partial,everything' is invalid; allowed"),
    ("bench_kernels", ["--scenarios", "decode 2 x 2k"], "--scenarios='decode 2 x 2k' is invalid"),
])
def test_every_script_exits_2_on_a_bad_option_naming_it(
        script: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        importlib.import_module(script).parse_args(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_names_keep_order_and_drop_repeats() -> None:
    assert options.names(option="--x", allowed=("a", "b", "c"))("c, a,c") == ("c", "a")


def test_targets_check_bounds_and_no_cost() -> None:
    at_most = Target(config="all-checks", workload="ttft1", bound=1.05, kind="at_most")
    assert Verdict(target=at_most, ratio=spread([1.0, 1.04])).met
    missed = Verdict(target=at_most, ratio=spread([1.02, 1.10]))  # 1.06 ±0.02
    assert missed.met is False and missed.within_noise
    assert "MISSED (within noise)" in missed.describe()
    assert not Verdict(target=at_most, ratio=spread([1.08, 1.10])).within_noise
    no_cost = Target(config="off", workload="decode1", bound=1.0, kind="no_cost")
    assert Verdict(target=no_cost, ratio=spread([0.98, 1.01])).met  # 0.995 ±0.0075
    assert not Verdict(target=no_cost, ratio=spread([1.01, 1.02])).met
    assert Verdict(target=no_cost, ratio=None).describe() == "off decode1 == 1x: not measured"
    with pytest.raises(ValueError, match="kind='exactly' is invalid"):
        Target(config="off", workload="x", bound=1.0, kind="exactly")


def test_a_result_set_is_one_json_and_one_text(tmp_path: pathlib.Path) -> None:
    json_path, text_path = write_result_set(out_dir=tmp_path / "out", name="server-tiny",
                                            document={"a": [1, 2]}, text="table\n\n")
    assert json.loads(json_path.read_text()) == {"a": [1, 2]}
    assert text_path.read_text() == "table\n"
    with pytest.raises(ValueError, match="'Server_Tiny' is invalid"):
        write_result_set(out_dir=tmp_path, name="Server_Tiny", document={}, text="")


# ----------------------------------------------------------------------------- configurations

def test_configurations_separate_the_plugin_the_flags_and_the_canary() -> None:
    assert tuple(CONFIGS) == (STOCK, "off", FLAGS_BASELINE, "canary", "all-checks")
    assert CONFIGS[STOCK].env == {"SGLANG_PLUGINS": "none"} and not CONFIGS[STOCK].plugin_loaded
    assert CONFIGS[STOCK].flags == CONFIGS["off"].flags == ()
    assert CONFIGS["off"].plugin_loaded and not CONFIGS["off"].canary_env
    assert CONFIGS[FLAGS_BASELINE].flags == CANARY_FLAGS == ("--disable-piecewise-cuda-graph",)
    assert CANARY_CONFIGS == ("canary", "all-checks")
    assert CONFIGS["canary"].canary_env == {"SGLANG_KV_CANARY_MODE": "log"}
    every = CONFIGS["all-checks"]
    assert every.flags[-2:] == ("--sampling-backend", "token_oracle")
    assert {name.removeprefix("SGLANG_KV_CANARY_") for name in every.canary_env} == {
        "MODE", "REAL_DATA", "SWEEP_INTERVAL", "ENABLE_TOKEN_ORACLE",
        "ENABLE_VERIFY_TOKEN_ASSERT", "ENABLE_WRITE_INPUT_ASSERT"}


def test_the_package_accepts_every_canary_configuration() -> None:
    from sglang.srt.kv_canary.config import parse_config

    for name in CANARY_CONFIGS:
        assert parse_config(CONFIGS[name].canary_env).canary_enabled


def test_every_server_gets_the_same_flags_but_its_configuration_s() -> None:
    spec = ServerSpec(model=MODELS["8b"], config=CONFIGS["all-checks"])
    flags = server_args(spec=spec, machine_args=MACHINE_ARGS)
    assert flags == (*MODELS["8b"].server_args, *COMMON_ARGS, *MACHINE_ARGS,
                     *CONFIGS["all-checks"].flags)
    # the configuration's sampling backend comes after the machine's (the last one wins)
    assert flags.index("token_oracle") > flags.index("pytorch")
    assert "--disable-piecewise-cuda-graph" not in server_args(
        spec=ServerSpec(model=MODELS["tiny"], config=CONFIGS[STOCK]), machine_args=())


def test_the_sliding_window_model_runs_triton_moe_in_every_configuration() -> None:
    for name, config in CONFIGS.items():
        flags = server_args(spec=ServerSpec(model=MODELS["tiny-swa"], config=config),
                            machine_args=MACHINE_ARGS)
        assert _flag(flags, "--moe-runner-backend") == "triton", name
        assert _flag(flags, "--load-format") == "dummy"
        assert _flag(flags, "--max-total-tokens") == str(HYBRID_FULL_POOL_TOKENS)
    assert "--moe-runner-backend" not in MODELS["tiny"].server_args


def _flag(args: tuple[str, ...], name: str) -> str:
    return args[args.index(name) + 1]


def test_every_workload_fits_the_pool_and_the_context() -> None:
    for workload in WORKLOADS.values():
        assert workload.kv_tokens <= KV_POOL_TOKENS and workload.context_tokens <= CONTEXT_LENGTH
    for model in MODELS.values():
        assert {target.workload for target in model.targets} <= set(WORKLOADS)
        assert {target.config for target in model.targets} <= set(CONFIGS) - {STOCK}
        pool = int(_flag(model.server_args, "--max-total-tokens"))
        assert _flag(model.server_args, "--context-length") == str(CONTEXT_LENGTH)
        # SGLang's sub-pools of a hybrid model: the full one as given, the sliding-window one
        # at --swa-full-tokens-ratio of it (HybridSWAPoolConfigurator)
        pools = (pool, int(pool * SWA_FULL_TOKENS_RATIO)) if model.hybrid_swa else (pool,)
        assert min(pools) >= KV_POOL_TOKENS, model.name


# ----------------------------------------------------------------------------- models

def test_the_swa_ratio_is_sglang_s_default() -> None:
    from sglang.srt.server_args import ServerArgs

    assert SWA_FULL_TOKENS_RATIO == ServerArgs.swa_full_tokens_ratio
    assert (HYBRID_FULL_POOL_TOKENS, int(HYBRID_FULL_POOL_TOKENS * SWA_FULL_TOKENS_RATIO)) == (
        46080, KV_POOL_TOKENS)


def test_the_default_run_leaves_the_sliding_window_model_out() -> None:
    assert DEFAULT_MODELS == ("tiny", "8b") and set(DEFAULT_MODELS) < set(MODELS)
    assert [name for name in MODELS if MODELS[name].hybrid_swa] == ["tiny-swa"]


def test_shapes_describe_their_layers_and_kv_bytes() -> None:
    tiny, swa = MODELS["tiny"], MODELS["tiny-swa"]
    assert (tiny.head_dim, tiny.full_attention_layers, tiny.sliding_window_layers) == (64, 4, 0)
    assert (tiny.kv_bytes_per_token, tiny.swa_kv_bytes_per_token) == (4 * 2 * 64 * 2 * 2, 0)
    assert tiny.describe() == ("llama, 4 layers, hidden 256, 4/2 heads, vocabulary 4096, dummy "
                               "weights, 2 KiB of KV per token")
    assert MODELS["8b"].kv_bytes_per_token == 36 * 8 * 128 * 2 * 2  # 144 KiB
    # gpt_oss: head_dim 64 (not hidden / heads = 32); layers 0, 2 sliding-window, 1, 3 full
    assert (swa.head_dim, swa.full_attention_layers, swa.sliding_window_layers) == (64, 2, 2)
    assert swa.kv_bytes_per_token == swa.swa_kv_bytes_per_token == 2 * 4 * 64 * 2 * 2
    assert swa.describe() == (
        "gpt_oss (MoE), 4 layers: 2 sliding-window (128 tokens), 2 full attention; hidden 256, "
        "8/4 heads of 64, vocabulary 4096, dummy weights; KV per token 2 KiB in the "
        "full-attention pool, 2 KiB in the sliding-window pool")
    shape = swa.to_json()
    assert (shape["sliding_window"], shape["swa_kv_bytes_per_token"]) == (128, 2048)
    assert MODELS["tiny"].to_json()["sliding_window"] is None


def test_a_sliding_window_belongs_to_gpt_oss_only() -> None:
    settings = dict(num_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                    vocab_size=512, server_args=(), startup_estimate_s=1.0, time_share=1.0,
                    targets=())
    with pytest.raises(ValueError, match="sliding_window=16 is invalid for architecture 'llama'"):
        ModelShape(name="x", architecture="llama", sliding_window=16, **settings)
    with pytest.raises(ValueError, match="sliding_window=None is invalid"):
        ModelShape(name="x", architecture=GPT_OSS, **settings)


def test_each_model_directory_is_written_by_its_layout_s_writer(tmp_path: pathlib.Path) -> None:
    written = {name: json.loads((make_model(model, directory=tmp_path / name)
                                 / "config.json").read_text())
               for name, model in MODELS.items()}
    swa = written["tiny-swa"]
    assert swa["architectures"] == ["GptOssForCausalLM"]
    assert swa["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert (swa["sliding_window"], swa["head_dim"], swa["num_key_value_heads"]) == (128, 64, 4)
    assert swa["max_position_embeddings"] == CONTEXT_LENGTH and swa["vocab_size"] == 4096
    assert written["tiny"]["architectures"] == ["LlamaForCausalLM"]
    assert written["8b"]["architectures"] == ["Qwen3ForCausalLM"]
    assert "layer_types" not in written["tiny"]
    for name, model in MODELS.items():
        config = written[name]
        assert (config["num_hidden_layers"], config["hidden_size"], config["head_dim"]) == (
            model.num_layers, model.hidden_size, model.head_dim)


# ----------------------------------------------------------------------------- workloads

def test_payloads_are_deterministic_ordinary_tokens_and_differ_by_round() -> None:
    workload = WORKLOADS["ttft64"]
    first = round_payload(workload=workload, vocab_size=4096, round_index=1, batch_index=0)
    assert first == round_payload(workload=workload, vocab_size=4096, round_index=1,
                                  batch_index=0)
    assert first["input_ids"] != round_payload(workload=workload, vocab_size=4096,
                                               round_index=2, batch_index=0)["input_ids"]
    prompts = first["input_ids"]
    assert len(prompts) == 64 and {len(prompt) for prompt in prompts} == {512}
    assert min(min(prompt) for prompt in prompts) >= 5
    assert first["sampling_params"]["stream_interval"] == workload.new_tokens


def _chunk(index: int, tokens: int, finished: bool) -> bytes:
    meta = {"completion_tokens": tokens, "prompt_tokens": 10,
            "finish_reason": {"type": "length"} if finished else None}
    return b"data: " + json.dumps({"index": index, "meta_info": meta}).encode()


def test_a_streamed_batch_gives_ttft_decode_and_throughput() -> None:
    collector = StreamCollector(num_requests=2, new_tokens=5, started=10.0)
    for line, at in ((_chunk(1, 1, False), 10.2), (b"", 10.2), (_chunk(0, 1, False), 10.3),
                     (_chunk(0, 5, True), 10.7), (_chunk(1, 5, True), 11.1)):
        assert collector.feed(line=line, at=at)
    assert not collector.feed(line=b"data: [DONE]", at=11.3)
    timing = collector.timing()
    assert timing.ttft_s == pytest.approx((0.3, 0.2))
    assert timing.decode_s == pytest.approx(0.8)  # last first token 10.3 -> last final 11.1
    assert timing.value("ttft_ms") == pytest.approx(250.0)
    assert timing.value("decode_tok_s") == pytest.approx(2 * 4 / 0.8)
    assert timing.value("prompt_tok_s") == pytest.approx(20 / 1.3)
    pooled = RoundTiming.pooled([timing, timing])
    assert pooled.value("ttft_ms") == pytest.approx(250.0) and len(pooled.ttft_s) == 4


def test_an_incomplete_stream_or_an_error_chunk_fails_the_round() -> None:
    collector = StreamCollector(num_requests=2, new_tokens=3, started=0.0)
    collector.feed(line=_chunk(0, 3, True), at=1.0)
    collector.feed(line=b"data: [DONE]", at=1.0)
    with pytest.raises(StreamError, match="1 of 2 requests"):
        collector.timing()
    with pytest.raises(StreamError, match="streamed an error"):
        StreamCollector(num_requests=1, new_tokens=2, started=0.0).feed(
            line=b'data: {"error": "boom"}', at=0.0)
    with pytest.raises(StreamError, match="index 7"):
        StreamCollector(num_requests=1, new_tokens=2, started=0.0).feed(
            line=_chunk(7, 1, False), at=0.0)
    stalled = RoundTiming(wall_s=1.0, ttft_s=(0.5,), decode_s=0.0, new_tokens=2,
                          prompt_tokens=1, output_tokens=2)
    with pytest.raises(ValueError, match="decode_tok_s needs a measured time"):
        stalled.value("decode_tok_s")


# ----------------------------------------------------------------------------- server logs

def test_pool_limits_and_misfits_come_from_the_log() -> None:
    log = ("max_total_num_tokens=1000, max_running_requests=8, context_len=600\n"
           "later: max_total_num_tokens=30000, max_running_requests=64, context_len=4096\n")
    limits = read_pool_limits(log)
    assert limits == PoolLimits(kv_tokens=30000, max_running_requests=64, context_len=4096,
                                swa_kv_tokens=None)
    assert limits.describe() == "KV pool 30000 tokens"
    assert misfit(workload=WORKLOADS["ttft64"], limits=limits) == (
        "does not fit: KV pool 30000 tokens < 32896 needed")
    assert misfit(workload=WORKLOADS["decode1"], limits=limits) is None
    assert misfit(workload=WORKLOADS["decode1"],
                  limits=read_pool_limits("no pool line")) is None


def test_a_hybrid_model_s_sliding_window_pool_comes_from_the_log() -> None:
    pool_line = "max_total_num_tokens=46080, max_running_requests=2048, context_len=4096\n"
    # the configurator logs the profiled sizes, then the capped ones
    log = ("Use sliding window memory pool. full_layer_tokens=900000, swa_layer_tokens=720000\n"
           "Use sliding window memory pool. full_layer_tokens=46080, swa_layer_tokens=36864\n"
           + pool_line)
    limits = read_pool_limits(log)
    assert (limits.kv_tokens, limits.swa_kv_tokens) == (46080, 36864)
    assert limits.describe() == "KV pool 46080 tokens, SWA pool 36864 tokens"
    assert pool_problem(model=MODELS["tiny-swa"], limits=limits) is None
    assert "no sliding-window pool" in pool_problem(model=MODELS["tiny-swa"],
                                                    limits=read_pool_limits(pool_line))
    assert pool_problem(model=MODELS["tiny"], limits=read_pool_limits(pool_line)) is None


def test_refusals_name_the_canary_error_first() -> None:
    log = ("Traceback ...\nValueError: something else\n"
           "[TP0] CanaryUnsupportedError: piecewise CUDA graph is enabled\n")
    assert refusal_reason(log_text=log, fallback="x") == (
        "CanaryUnsupportedError: piecewise CUDA graph is enabled")
    assert refusal_reason(log_text="nothing", fallback="exit 3\nmore") == "exit 3"


def test_a_log_report_finds_what_contradicts_the_configuration() -> None:
    canary_log = ("Loaded plugin kv_canary from group sglang.srt.plugins\n"
                  "[TP0] KV canary enabled: mode=log real_data=none\n"
                  "[TP0] KV canary stats: protected 1234 tokens, 0 violations\n")
    report = read_log_report(config=CONFIGS["canary"], log_text=canary_log)
    assert (report.plugin, report.canary_running, report.tokens_checked) == ("loaded", True, 1234)
    assert report.problems(CONFIGS["canary"]) == []
    assert "canary on, 1234 tokens checked, 0 violations" in report.describe()
    violating = read_log_report(config=CONFIGS["canary"],
                                log_text=canary_log + "kv_canary violation: check=pre\n")
    assert violating.problems(CONFIGS["canary"]) == ["1 canary violation lines"]
    silent = read_log_report(config=CONFIGS["all-checks"], log_text="Capture piecewise CUDA "
                                                                    "graph end\n")
    assert silent.piecewise_cuda_graph and silent.plugin == "unknown"
    assert silent.problems(CONFIGS["all-checks"]) == [
        "the canary did not start (no start-up line in its mode)"]
    stock = read_log_report(config=CONFIGS[STOCK], log_text=canary_log)
    assert stock.problems(CONFIGS[STOCK]) == [
        "a canary ran in a configuration without one",
        "the plugin was loaded in a configuration without it"]
    skipped = "Skipping plugin kv_canary (not in SGLANG_PLUGINS)\n"
    assert read_log_report(config=CONFIGS[STOCK], log_text=skipped).plugin == "not loaded"


# ----------------------------------------------------------------------------- interleaving

def _timing(value_ms: float) -> RoundTiming:
    return RoundTiming(wall_s=1.0, ttft_s=(value_ms / 1e3,), decode_s=1.0, new_tokens=2,
                       prompt_tokens=1, output_tokens=2)


def test_rounds_interleave_rotate_and_pair_by_round_index() -> None:
    calls: list[tuple[str, str, int]] = []

    def participant(label: str) -> Participant:
        def one_round(workload, index):
            calls.append((label, workload.name, index))
            return _timing(10.0 * (index + 1))

        return Participant(label=label, run_round=one_round)

    workloads = [WORKLOADS["ttft1"], WORKLOADS["decode1"]]
    measured = measure_interleaved(participants=[participant("a"), participant("b")],
                                   workloads=workloads, deadline=Deadline.after(60.0),
                                   max_rounds=2)
    assert (measured.sweeps, measured.stopped) == (2, "max rounds")
    assert calls == [("a", "ttft1", 0), ("b", "ttft1", 0), ("a", "decode1", 0),
                     ("b", "decode1", 0),
                     ("a", "ttft1", 1), ("b", "ttft1", 1), ("a", "decode1", 1),
                     ("b", "decode1", 1),
                     ("b", "ttft1", 2), ("a", "ttft1", 2), ("b", "decode1", 2),
                     ("a", "decode1", 2)]
    assert sorted(measured.series(label="a", workload="ttft1")) == [1, 2]  # no warm-up round


def test_rotation_gives_every_item_every_place() -> None:
    assert [rotated("abc", by=shift) for shift in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert rotated([], by=3) == []


def test_each_participant_runs_only_for_its_own_rounds() -> None:
    events: list[str] = []

    def participant(label: str) -> Participant:
        def one_round(workload, index):
            events.append(f"{label} round {index}")
            return _timing(1.0)

        return Participant(label=label, run_round=one_round,
                           resume=lambda: events.append(f"{label} resumed"),
                           pause=lambda: events.append(f"{label} paused"))

    measure_interleaved(participants=[participant("a"), participant("b")],
                        workloads=[WORKLOADS["ttft1"]], deadline=Deadline.after(60.0),
                        max_rounds=1)
    assert events == ["a resumed", "a round 0", "a paused", "b resumed", "b round 0",
                      "b paused", "a resumed", "a round 1", "a paused", "b resumed",
                      "b round 1", "b paused"]


def test_a_failing_participant_is_left_out_and_the_budget_stops_the_sweeps() -> None:
    now = [0.0]

    def one_round(workload, index):
        now[0] += 1.0
        return _timing(5.0)

    def failing(workload, index):
        raise RuntimeError("server went away\ntraceback")

    skip = Participant(label="small", run_round=one_round,
                       skip=lambda workload: "does not fit" if workload.name == "decode1" else None)
    broken = Participant(label="broken", run_round=failing)
    measured = measure_interleaved(
        participants=[skip, broken], workloads=[WORKLOADS["ttft1"], WORKLOADS["decode1"]],
        deadline=Deadline.after(3.5, clock=lambda: now[0]), max_rounds=10,
        clock=lambda: now[0])
    # the warm-up sweep and two sweeps take 1 s each; a third would end after 3.5 s
    assert (measured.sweeps, measured.stopped) == (2, "time budget")
    assert broken.failure == "server went away"
    assert any("broken: left out from ttft1 round 0" in note for note in measured.notes)
    assert "small: decode1 skipped: does not fit" in measured.notes
    assert measured.series(label="broken", workload="ttft1") == {}
    with pytest.raises(ValueError, match="max_rounds=0 is invalid"):
        measure_interleaved(participants=[], workloads=[], deadline=Deadline.after(1.0),
                            max_rounds=0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
