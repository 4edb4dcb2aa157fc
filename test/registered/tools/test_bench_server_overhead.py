"""``benchmark/bench_server_overhead.py`` without a server: options, workloads, the time budget,
start-up refusal reasons, the canary status read from a log, the table and the JSON, on fake
measurements."""

import importlib.util
import json
import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="kv-canary-cpu")

_BENCH_PATH = (pathlib.Path(__file__).resolve().parents[3] / "benchmark"
               / "bench_server_overhead.py")


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_server_overhead", _BENCH_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


bench = _load_bench()
ALL_CONFIGS = ("off", "oracle", "canary", "canary+partial", "all-checks", "stock")


# ----------------------------------------------------------------------------- options

def test_defaults() -> None:
    options = bench.parse_args([])
    assert options.models == ("tiny", "8b")
    assert options.configs == ALL_CONFIGS
    assert (options.repeats, options.time_budget_s) == (3, 540.0)
    assert options.out is None and options.log_dir is None


def test_lists_keep_order_and_drop_repeats(tmp_path: pathlib.Path) -> None:
    options = bench.parse_args([
        "--models", "8b, tiny,8b", "--configs", "oracle,all-checks,oracle", "--repeats", "5",
        "--out", str(tmp_path / "bench.json"), "--log-dir", str(tmp_path / "logs"),
        "--time-budget-s", "100",
    ])
    assert options.models == ("8b", "tiny")
    assert options.configs == ("oracle", "all-checks")
    assert (options.repeats, options.time_budget_s) == (5, 100.0)
    assert options.out == tmp_path / "bench.json" and options.log_dir == tmp_path / "logs"


@pytest.mark.parametrize("argv,fragment", [
    (["--models", "tiny,70b"], "--models='tiny,70b' is invalid; allowed: a comma-separated list "
                               "of tiny, 8b"),
    (["--models", ","], "--models=',' is invalid"),
    (["--configs", "off,canary-all"], "--configs='off,canary-all' is invalid"),
    (["--repeats", "0"], "--repeats=0 is invalid; allowed: an integer >= 1"),
    (["--time-budget-s", "0"], "--time-budget-s=0.0 is invalid; allowed: > 0"),
])
def test_bad_options_exit_2_naming_the_option(argv: list[str], fragment: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(argv)
    assert stopped.value.code == 2
    assert fragment in capsys.readouterr().err


# ----------------------------------------------------------------------------- what runs

def test_configs_differ_only_in_what_they_name() -> None:
    configs = bench.CONFIGS
    assert tuple(configs) == ALL_CONFIGS
    assert configs["off"].env == {} and configs["off"].sampling_backend == "pytorch"
    assert "SGLANG_PLUGINS" in configs["stock"].env
    oracle = dict(configs["oracle"].env)
    assert oracle == {"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"}
    for name in ("oracle", "canary", "canary+partial", "all-checks"):
        assert configs[name].sampling_backend == "token_oracle"
        assert oracle.items() <= dict(configs[name].env).items()
    assert dict(configs["all-checks"].env) == {
        **oracle, "SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA": "partial",
        "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
        "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1",
    }
    assert [name for name, config in configs.items() if config.canary_on] == [
        "canary", "canary+partial", "all-checks"]


def test_round_payloads_are_distinct_per_round_and_equal_per_config() -> None:
    workload = bench.PREFILL
    first = bench.round_payload(workload=workload, vocab_size=4096, round_index=1)
    assert first == bench.round_payload(workload=workload, vocab_size=4096, round_index=1)
    prompts = first["input_ids"]
    assert len(prompts) == 32 and {len(prompt) for prompt in prompts} == {2048}
    assert min(min(p) for p in prompts) >= 5 and max(max(p) for p in prompts) < 4096
    assert len({tuple(prompt[:8]) for prompt in prompts}) == 32
    second = bench.round_payload(workload=workload, vocab_size=4096, round_index=2)
    assert not {tuple(p[:8]) for p in prompts} & {tuple(p[:8]) for p in second["input_ids"]}
    assert first["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.0,
                                        "ignore_eos": True}


def test_the_8b_model_has_the_qwen3_8b_shape(tmp_path: pathlib.Path) -> None:
    directory = bench.make_model(bench.MODELS["8b"], directory=tmp_path / "8b")
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert {key: config[key] for key in (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings")} == {
        "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
        "vocab_size": 151936, "max_position_embeddings": 4096}


# ----------------------------------------------------------------------------- the time budget

class _FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_budget_skips_configs_that_no_longer_fit_and_goes_on() -> None:
    clock = _FakeClock()
    deadline = bench.Deadline.after(250.0, clock=clock)
    measured = []

    def measure(*, config, **_: object):
        measured.append(config.name)
        clock.now += 100.0
        return bench.ConfigResult(config=config.name, status="measured", duration_s=100.0)

    results = list(bench.iter_model_results(
        model=bench.MODELS["tiny"], model_dir=pathlib.Path("unused"),
        configs=[bench.CONFIGS[name] for name in ("off", "oracle", "canary", "all-checks")],
        repeats=3, deadline=deadline, log_dir=pathlib.Path("unused"), measure=measure,
    ))
    assert measured == ["off", "oracle"]  # 90 s <= 250 left, 100 <= 150 left, 100 > 50 left
    assert [result.status for result in results[2:]] == [
        "skipped: time budget (100 s needed, 50 s left)"] * 2


def test_a_refused_config_does_not_set_the_estimate() -> None:
    clock = _FakeClock()
    deadline = bench.Deadline.after(95.0, clock=clock)

    def measure(*, config, **_: object):
        clock.now += 10.0
        return bench.ConfigResult(config=config.name, status="refused: X", duration_s=10.0)

    results = list(bench.iter_model_results(
        model=bench.MODELS["tiny"], model_dir=pathlib.Path("unused"),
        configs=[bench.CONFIGS["all-checks"], bench.CONFIGS["off"]], repeats=1,
        deadline=deadline, log_dir=pathlib.Path("unused"), measure=measure,
    ))
    assert [result.status for result in results] == [
        "refused: X", "skipped: time budget (90 s needed, 85 s left)"]


class _FakeServer:
    """``flush_cache`` and ``generate`` of a RunningServer; each batch costs ``cost_s`` of
    the fake clock."""

    def __init__(self, clock: _FakeClock, *, cost_s: float) -> None:
        self.clock, self.cost_s, self.batches = clock, cost_s, []

    def flush_cache(self) -> bool:
        return True

    def generate(self, payload: dict) -> list[dict]:
        self.clock.now += self.cost_s
        self.batches.append(payload)
        new_tokens = payload["sampling_params"]["max_new_tokens"]
        return [{"meta_info": {"prompt_tokens": len(prompt), "completion_tokens": new_tokens}}
                for prompt in payload["input_ids"]]


def test_measure_workload_warms_up_then_measures_what_fits() -> None:
    clock = _FakeClock()
    server = _FakeServer(clock, cost_s=10.0)
    result = bench.measure_workload(server, workload=bench.BS1, vocab_size=4096, repeats=3,
                                    deadline=bench.Deadline.after(35.0, clock=clock))
    assert len(server.batches) == 3  # warm-up (25 s left), round 1 (15 s left), round 2 (5 s)
    assert server.batches[0] != server.batches[1]
    assert result.wall_s == (10.0, 10.0)
    assert (result.num_requests, result.prompt_tokens, result.output_tokens) == (1, 128, 512)
    assert bench.measure_workload(server, workload=bench.BS1, vocab_size=4096, repeats=3,
                                  deadline=bench.Deadline.after(5.0, clock=clock)) is None


# ----------------------------------------------------------------------------- server logs

def test_refusal_reason_prefers_the_canary_error() -> None:
    log = "\n".join([
        "[2026 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "  File \"x.py\", line 1, in f",
        "sglang.srt.kv_canary.runner.refusals.CanaryUnsupportedError: KV canary cannot protect this",
        "RuntimeError: Initialization failed. Please see the error messages above.",
    ])
    assert bench.refusal_reason(log_text=log, fallback="exited") == (
        "CanaryUnsupportedError: KV canary cannot protect this")


def test_refusal_reason_takes_the_first_traceback_line_then_the_fallback() -> None:
    log = "loading\nsglang.srt.foo.SomeError: first\nRuntimeError: second\n"
    assert bench.refusal_reason(log_text=log, fallback="x") == "sglang.srt.foo.SomeError: first"
    assert bench.refusal_reason(log_text="no error here\n",
                                fallback="the server exited with code 1\ntail") == (
        "the server exited with code 1")
    assert len(bench.refusal_reason(log_text="ValueError: " + "v" * 999, fallback="")) == 240


def test_canary_status_reads_the_log() -> None:
    canary, oracle = bench.CONFIGS["canary"], bench.CONFIGS["oracle"]
    started = "[2026 TP0] KV canary enabled: mode=log real_data=none token_oracle=on\n"
    stats = ("[2026 TP0] KV canary stats: protected 1234 tokens (slots verified), 99 slots "
             "written, 1 violations, 100 steps\n")
    violation = ("[2026 TP0] kv_canary violation: check=pre_verify reasons=verify_position "
                 "slot=7\n")
    assert bench.canary_status(config=oracle, log_text=started) == "-"
    assert bench.canary_status(config=canary, log_text="nothing\n") == "NOT RUNNING"
    assert bench.canary_status(
        config=canary, log_text="KV canary enabled: mode=none token_oracle=on\n") == "NOT RUNNING"
    assert bench.canary_status(config=canary, log_text=started) == (
        "on, no stats line, 0 violations")
    assert bench.canary_status(config=canary, log_text=started + stats + violation) == (
        "on, 1234 tokens checked, 1 violations")


# ----------------------------------------------------------------------------- the table

def _measured(name: str, *, decode_walls: tuple[float, ...], bs1_wall: float,
              prefill_wall: float, canary: str = "-") -> object:
    workloads = {
        "decode64": bench.WorkloadResult(workload="decode64", num_requests=64,
                                         wall_s=decode_walls, prompt_tokens=64 * 128,
                                         output_tokens=64 * 256),
        "bs1": bench.WorkloadResult(workload="bs1", num_requests=1, wall_s=(bs1_wall,),
                                    prompt_tokens=128, output_tokens=512),
        "prefill32": bench.WorkloadResult(workload="prefill32", num_requests=32,
                                          wall_s=(prefill_wall,), prompt_tokens=32 * 2048,
                                          output_tokens=32 * 8),
    }
    return bench.ConfigResult(config=name, status="measured", workloads=workloads,
                              canary=canary, startup_s=30.0, duration_s=60.0)


def _fake_results() -> list:
    return [
        _measured("off", decode_walls=(1.0, 9.0, 0.5), bs1_wall=0.512, prefill_wall=0.5),
        _measured("oracle", decode_walls=(1.0,), bs1_wall=0.512, prefill_wall=0.5),
        _measured("canary", decode_walls=(1.25,), bs1_wall=0.5632, prefill_wall=0.64,
                  canary="on, 999 tokens checked, 0 violations"),
        bench.ConfigResult(config="all-checks", status="refused: CanaryConfigError: not wired"),
    ]


def test_medians_and_derived_numbers() -> None:
    off = _fake_results()[0].workloads
    assert off["decode64"].median_wall_s == 1.0
    assert off["decode64"].output_tok_s == 16384.0
    assert off["bs1"].ms_per_step == pytest.approx(1.0)
    assert off["prefill32"].prompt_tok_s == 131072.0


def test_rows_compare_with_off_and_oracle() -> None:
    off, oracle, canary, refused = bench.table_rows(_fake_results())
    assert (off.decode_vs_off, off.bs1_added_ms_vs_off, off.prefill_vs_off) == (1.0, 0.0, 1.0)
    assert canary.decode_vs_oracle == 0.8 and canary.prefill_vs_oracle == 0.78125
    assert canary.bs1_added_ms_vs_oracle == pytest.approx(0.1)
    assert canary.worst_vs_oracle == 0.78125
    assert refused.decode_tok_s is None and refused.worst_vs_oracle is None


def test_rows_without_a_reference_have_no_ratio() -> None:
    (canary,) = bench.table_rows(_fake_results()[2:3])
    assert canary.decode_tok_s == pytest.approx(13107.2)
    assert (canary.decode_vs_off, canary.decode_vs_oracle, canary.bs1_added_ms_vs_off,
            canary.worst_vs_oracle) == (None, None, None, None)


def test_table_text() -> None:
    text = bench.format_table(model=bench.MODELS["tiny"], results=_fake_results(), repeats=3)
    lines = text.splitlines()
    assert lines[0] == ("== tiny: llama, 4 layers, hidden 256, 4/2 heads, vocab 4096, dummy "
                        "weights; median of 3 ==")
    assert lines[1].split() == [
        "config", "decode64", "tok/s", "/off", "/oracle", "bs1", "ms/step", "+ms/off",
        "+ms/oracle", "prefill", "tok/s", "/off", "/oracle", "worst/oracle", "canary"]
    assert lines[2].split() == ["off", "16384", "1.000", "1.000", "1.000", "+0.000", "+0.000",
                                "131072", "1.000", "1.000", "1.000", "-"]
    assert lines[4].split() == ["canary", "13107", "0.800", "0.800", "1.100", "+0.100", "+0.100",
                                "102400", "0.781", "0.781", "0.781", "on,", "999", "tokens", "checked,", "0",
                                "violations"]
    assert lines[5].split() == ["all-checks"] + ["-"] * 11
    canary_column = lines[1].rindex("canary")  # every column aligned: the last starts together
    assert all(line[canary_column - 2:canary_column + 1].startswith("  ")
               and line[canary_column] != " " for line in lines[1:6])
    assert lines[6].startswith("targets (SPEC 11): all-checks >= 0.920x")
    assert lines[7] == "note: all-checks: refused: CanaryConfigError: not wired"


def test_progress_line() -> None:
    line = bench.progress_line(model=bench.MODELS["8b"], result=_fake_results()[2])
    assert line == ("[8b] canary: measured; ready in 30 s, done in 60 s; decode64 13107 tok/s; "
                    "bs1 1.100 ms/step; prefill32 102400 tok/s; canary on, 999 tokens checked, "
                    "0 violations")


def test_json_report_holds_every_number() -> None:
    options = bench.parse_args(["--models", "tiny", "--configs", "off,oracle,canary,all-checks"])
    report = json.loads(json.dumps(bench.report_json(options=options,
                                                     results={"tiny": _fake_results()})))
    tiny = report["models"]["tiny"]
    assert tiny["shape"]["num_layers"] == 4
    assert [r["status"] for r in tiny["results"]] == ["measured"] * 3 + [
        "refused: CanaryConfigError: not wired"]
    assert tiny["results"][0]["workloads"]["decode64"]["wall_s"] == [1.0, 9.0, 0.5]
    assert tiny["table"][2]["decode_vs_oracle"] == 0.8
    assert set(report["configs"]) == {"off", "oracle", "canary", "all-checks"}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
