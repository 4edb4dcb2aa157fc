"""``benchmark/bench_server_overhead.py`` without a GPU: options, configurations and their server
flags, workloads and their payloads, TTFT and decode-step parsing of streamed answers, pool
limits read from a log, the time budget (skips, the kept time and the final repeat of the first
configuration), the table with baselines, noise and target verdicts, and the JSON. Real HTTP
against ``fake_sglang_server.py`` (a stand-in for ``sglang.launch_server``) for the streamed
rounds, one whole server and ``main``."""

import dataclasses
import functools
import json
import pathlib
import sys
import time
import types

import pytest

from sglang.srt.kv_canary.tools.server import ServerLaunch, start_server
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="kv-canary-cpu")

_HERE = pathlib.Path(__file__).resolve().parent
_BENCH_DIR = _HERE.parents[2] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))  # the script imports its sibling modules by name

import bench_server_overhead as bench  # noqa: E402
import server_overhead_report as report_script  # noqa: E402
import server_overhead_table as table  # noqa: E402
import server_workloads as workloads  # noqa: E402

DEFAULT_CONFIGS = ("off", "all-checks", "all-checks-s4", "canary", "canary+partial", "oracle",
                   "stock", "stock-piecewise")
SPLIT_CONFIGS = ("canary+verify-token", "canary+write-input")  # run only when named
ALL_WORKLOADS = ("decode64", "bs1", "ttft1", "prefill32", "prefill64x512", "decode64_8k",
                 "bs1_32k", "admit64_8k")


# ----------------------------------------------------------------------------- options

def test_defaults_let_the_8b_model_run_in_a_10_minute_command() -> None:
    options = bench.parse_args([])
    assert options.models == ("8b",)
    assert options.configs == DEFAULT_CONFIGS
    assert options.workloads == ALL_WORKLOADS
    assert (options.repeats, options.time_budget_s, options.repeat_first) == (3, 570.0, True)
    assert options.out is None and options.log_dir is None
    model = bench.MODELS["8b"]
    one_server_s = model.first_config_estimate_s(
        workloads=[workloads.WORKLOADS_BY_NAME[name] for name in ALL_WORKLOADS], repeats=3)
    assert 2 * one_server_s <= options.time_budget_s  # off and all-checks fit


def test_lists_keep_order_and_drop_repeats(tmp_path: pathlib.Path) -> None:
    options = bench.parse_args([
        "--models", "8b, tiny,8b", "--configs", "oracle,all-checks,oracle", "--repeats", "5",
        "--workloads", "bs1_32k,decode64", "--out", str(tmp_path / "bench.json"),
        "--log-dir", str(tmp_path / "logs"), "--time-budget-s", "100", "--no-repeat-first",
    ])
    assert options.models == ("8b", "tiny")
    assert options.configs == ("oracle", "all-checks")
    assert options.workloads == ("bs1_32k", "decode64")
    assert (options.repeats, options.time_budget_s, options.repeat_first) == (5, 100.0, False)
    assert options.out == tmp_path / "bench.json" and options.log_dir == tmp_path / "logs"


def test_repeats_can_differ_per_model() -> None:
    options = bench.parse_args(["--models", "tiny,8b", "--repeats", "tiny=12, 8b=2"])
    assert (options.repeats_for("tiny"), options.repeats_for("8b")) == (12, 2)
    options = bench.parse_args(["--models", "tiny,8b", "--repeats", "4,tiny=12"])
    assert (options.repeats_for("tiny"), options.repeats_for("8b")) == (12, 4)
    assert bench.parse_args(["--repeats", "5"]).repeats_for("8b") == 5


@pytest.mark.parametrize("argv,fragment", [
    (["--models", "tiny,70b"], "--models='tiny,70b' is invalid; allowed: a comma-separated list "
                               "of 8b, tiny"),
    (["--models", ","], "--models=',' is invalid"),
    (["--configs", "off,canary-all"], "--configs='off,canary-all' is invalid"),
    (["--workloads", "decode64,decode128"], "--workloads='decode64,decode128' is invalid"),
    (["--repeats", "0"], "--repeats='0' is invalid; allowed: an integer >= 1, or MODEL=N pairs"),
    (["--repeats", "tiny=0"], "--repeats='tiny=0' is invalid"),
    (["--repeats", "70b=3"], "--repeats='70b=3' is invalid"),
    (["--repeats", "=3"], "--repeats='=3' is invalid"),
    (["--repeats", "tiny=x"], "--repeats='tiny=x' is invalid"),
    (["--repeats", "3,4"], "--repeats='3,4' is invalid"),
    (["--repeats", "tiny=3,tiny=4"], "--repeats='tiny=3,tiny=4' is invalid"),
    (["--time-budget-s", "0"], "--time-budget-s=0.0 is invalid; allowed: > 0"),
    (["--host-timers", "-1"], "--host-timers=-1 is invalid; allowed: an integer >= 0 (0: off)"),
    (["--eagle-steps", "-2"], "--eagle-steps=-2 is invalid; allowed: an integer >= 0 (0: off)"),
    (["--cycles", "0"], "--cycles=0 is invalid; allowed: an integer >= 1"),
])
def test_bad_options_exit_2_naming_the_option(argv: list[str], fragment: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(argv)
    assert stopped.value.code == 2
    assert fragment in capsys.readouterr().err


def test_host_timers_load_the_timing_sitecustomize_in_every_server(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert bench.parse_args([]).host_timers == 0
    assert bench.parse_args(["--host-timers", "500"]).host_timers == 500
    monkeypatch.setenv("PYTHONPATH", "/shell/path")
    config = bench.with_host_timers(bench.CONFIGS["all-checks"], every_n_forwards=500)
    assert config.env["KV_CANARY_HOST_TIMERS"] == "500"
    assert config.env["PYTHONPATH"].split(":") == [str(bench.HOST_TIMERS_DIR), "/shell/path"]
    assert (bench.HOST_TIMERS_DIR / "sitecustomize.py").is_file()
    # the models' decoder layers are timed as controls, beside the script's own extra timers
    assert config.env["KV_CANARY_HOST_TIMERS_EXTRA"].split(",") == list(bench.MODEL_CONTROL_TIMERS)
    monkeypatch.setenv("KV_CANARY_HOST_TIMERS_EXTRA",
                       f"m:f, {bench.MODEL_CONTROL_TIMERS[1]}")
    extra = bench.with_host_timers(bench.CONFIGS["off"], every_n_forwards=5).env[
        "KV_CANARY_HOST_TIMERS_EXTRA"]
    assert extra.split(",") == ["m:f", bench.MODEL_CONTROL_TIMERS[1], bench.MODEL_CONTROL_TIMERS[0]]
    assert {name.split(":")[1] for name in bench.MODEL_CONTROL_TIMERS} == set(
        table.MODEL_CONTROLS)
    assert {k: v for k, v in config.env.items() if k.startswith("SGLANG_")} == {
        k: v for k, v in bench.CONFIGS["all-checks"].env.items() if k.startswith("SGLANG_")}
    log = tmp_path / "server.log"
    log.write_text("x\n[t] KV canary host timers over 2 forwards: a 1.0us x1.00\n"
                   "[t] KV canary host timers over 2 forwards: a 2.0us x1.00\nend\n")
    assert bench.last_host_timers_line(str(log)) == (
        "KV canary host timers over 2 forwards: a 2.0us x1.00")
    assert bench.last_host_timers_line(str(tmp_path / "missing.log")) is None
    # a server whose workloads logged no line of their own: its last line stands for it
    server = table.ConfigResult(config="off", status="measured", log_path=str(log),
                                workloads={"bs1": table.WorkloadResult(workload="bs1",
                                                                       status="measured")})
    assert bench.host_timers_report(server) == [
        "off: KV canary host timers over 2 forwards: a 2.0us x1.00"]


def test_a_smaller_pool_caps_every_server_of_the_run(tmp_path: pathlib.Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-total-tokens N``: every server's pool flag is N (three 8B servers fit one GPU
    together for the short workloads); the JSON records the flags the servers got."""
    assert bench.parse_args([]).max_total_tokens == 0
    assert bench.parse_args(["--max-total-tokens", "65536"]).max_total_tokens == 65536
    with pytest.raises(SystemExit):
        bench.parse_args(["--max-total-tokens", "-1"])
    assert ("--max-total-tokens=-1 is invalid; allowed: an integer >= 1 (0: the full pool)"
            in capsys.readouterr().err)
    model = bench.with_pool(bench.MODELS["8b"], max_total_tokens=65536)
    flags = dict(zip(model.server_args[::2], model.server_args[1::2]))
    assert flags["--max-total-tokens"] == "65536" and flags["--mem-fraction-static"] == "0.8"
    assert len(model.server_args) == len(bench.MODELS["8b"].server_args)
    served: list[tuple[str, ...]] = []

    def together(*, model, plan, **_: object) -> list[table.ConfigResult]:
        served.append(model.server_args)
        return [table.ConfigResult(config=config.name, run=run, status=bench.MEASURED)
                for config, run in plan]

    out = tmp_path / "bench.json"
    assert bench.main(["--models", "tiny", "--configs", "off,canary", "--workloads", "ttft1",
                       "--together", "tiny", "--max-total-tokens", "4096", "--out", str(out),
                       "--log-dir", str(tmp_path / "logs")], together=together) == 0
    (args,) = served
    assert dict(zip(args[::2], args[1::2]))["--max-total-tokens"] == "4096"
    report = json.loads(out.read_text())
    assert report["options"]["max_total_tokens"] == 4096
    recorded = report["models"]["tiny"]["server_args"]["canary"]
    assert recorded[recorded.index("--max-total-tokens") + 1] == "4096"


def test_eagle_steps_serve_every_configuration_with_an_eagle_draft(
        tmp_path: pathlib.Path) -> None:
    assert bench.parse_args([]).eagle_steps == 0
    assert bench.parse_args(["--eagle-steps", "3"]).eagle_steps == 3
    model = bench.with_eagle(bench.MODELS["tiny"], draft_dir=tmp_path / "draft", steps=3)
    for config in ("off", "all-checks"):
        args = bench.launch_args(model=model, config=bench.CONFIGS[config])[1]
        flags = dict(zip(args[::2], args[1::2]))
        assert flags["--speculative-algorithm"] == "EAGLE"
        assert flags["--speculative-draft-model-path"] == str(tmp_path / "draft")
        assert (flags["--speculative-num-steps"], flags["--speculative-eagle-topk"],
                flags["--speculative-num-draft-tokens"]) == ("3", "1", "4")
    assert bench.MODELS["tiny"].server_args == model.server_args[: -10]


def _load_sitecustomize(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A fresh copy of the host-timers ``sitecustomize``, loaded with nothing wrapped and the
    sync check off."""
    import importlib.util

    monkeypatch.setenv("KV_CANARY_HOST_TIMERS", "0")  # loaded without wrapping anything
    monkeypatch.delenv("KV_CANARY_SYNC_CHECK", raising=False)
    spec = importlib.util.spec_from_file_location(
        "kv_canary_host_timers", bench.HOST_TIMERS_DIR / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sync_check_counts_the_canary_lines_apart(caplog: pytest.LogCaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    site = _load_sitecustomize(monkeypatch)
    assert [site.sync_check_enabled(v) for v in ("", "0", "1")] == [False, False, True]
    for bad in ("yes", "2"):
        with pytest.raises(ValueError, match=f"KV_CANARY_SYNC_CHECK='{bad}' is invalid"):
            site.sync_check_enabled(bad)
    check = site._SyncCheck()
    shown = []
    check._show = lambda *args: shown.append(args)
    sync = UserWarning("called a synchronizing CUDA operation")
    canary_file = "/site/sglang/srt/kv_canary/runner/canary_runner.py"
    with caplog.at_level("WARNING"):
        check._on_warning(sync, UserWarning, canary_file, 10)
        check._on_warning(sync, UserWarning, canary_file, 10)
        check._on_warning(sync, UserWarning, "/site/sglang/srt/managers/scheduler.py", 5)
        check._on_warning(UserWarning("other"), UserWarning, canary_file, 11)
    assert check.canary == {f"{canary_file}:10": 2} and check.elsewhere == 1
    assert len(shown) == 1  # another warning is shown as before
    (first,) = [r.getMessage() for r in caplog.records]  # a canary line is logged once
    assert first.startswith(f"KV canary sync check: canary code synchronized at {canary_file}:10")
    caplog.clear()
    with caplog.at_level("WARNING"):
        for _ in range(site.SYNC_CHECK_EVERY):
            check.count_forward()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (f"KV canary sync check over {site.SYNC_CHECK_EVERY} forwards: canary 2, "
                    f"elsewhere 1 ({canary_file}:10 x2)")


def test_the_timing_sitecustomize_logs_means_per_forward(caplog: pytest.LogCaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    timers = _load_sitecustomize(monkeypatch)
    monkeypatch.setattr(timers, "_EVERY", 2)
    forward = timers._wrap(timers.TIMED[0][1], lambda: time.sleep(0.001))
    helper = timers._wrap("helper", lambda value: value)
    with caplog.at_level("WARNING"):
        assert helper(7) == 7
        forward()
        assert not caplog.records
        helper(1)
        helper(2)
        forward()
    (line,) = [record.getMessage() for record in caplog.records]
    assert line.startswith("KV canary host timers over 2 forwards: ModelRunner.forward ")
    assert "helper " in line and line.endswith("x1.50")
    # garbage collections are timed per generation through gc.callbacks
    caplog.clear()
    timers._time_garbage_collection("start", {"generation": 2})
    time.sleep(0.001)
    timers._time_garbage_collection("stop", {"generation": 2})
    with caplog.at_level("WARNING"):
        forward()
        forward()
    (line,) = [record.getMessage() for record in caplog.records]
    assert float(line.split("gc.gen2 ")[1].split("us")[0]) >= 1000
    assert line.split("gc.gen2 ")[1].split(" ")[1].rstrip(",") == "x0.50"

    assert float(line.split("ModelRunner.forward ")[1].split("us")[0]) >= 1000
    assert [timers.every_n_forwards(v) for v in ("", "0", "500")] == [0, 0, 500]
    for bad in ("-1", "often", "1.5"):
        with pytest.raises(ValueError, match=f"KV_CANARY_HOST_TIMERS='{bad}' is invalid"):
            timers.every_n_forwards(bad)
    assert [timers.burn_us(v) for v in ("", "0", "150")] == [0, 0, 150]
    for bad in ("-5", "lots"):
        with pytest.raises(ValueError, match=f"KV_CANARY_HOST_TIMERS_BURN_US='{bad}' is invalid"):
            timers.burn_us(bad)
    runner_class = type("Runner", (), {"forward": lambda self, batch: batch * 2})
    monkeypatch.setattr(timers, "_BURN_DATA", [list(range(64))] * 10)
    timers._add_burn(runner_class, 2000)
    start = time.perf_counter()
    assert runner_class().forward(21) == 42
    assert time.perf_counter() - start >= 0.002  # the burn ran before the forward
    assert timers.extra_timed("") == ()
    assert timers.extra_timed("a.b:C.f, d:g") == (("a.b", "C.f"), ("d", "g"))
    with pytest.raises(ValueError, match="KV_CANARY_HOST_TIMERS_EXTRA item 'a.b' is invalid"):
        timers.extra_timed("a.b")


def test_the_timing_sitecustomize_splits_hooks_by_forward_mode(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hook called with ``forward_batch=`` is timed in total and per forward mode, so a
    prefill's on_init_new is not averaged with the decode steps'."""
    timers = _load_sitecustomize(monkeypatch)
    monkeypatch.setattr(timers, "_EVERY", 3)
    forward = timers._wrap(timers.TIMED[0][1], lambda: None)
    hook = timers._wrap("CanaryRunner.on_init_new",
                        lambda *, forward_batch: time.sleep(forward_batch.sleep_s))
    extend = types.SimpleNamespace(forward_mode=types.SimpleNamespace(name="EXTEND"),
                                   sleep_s=0.004)
    decode = types.SimpleNamespace(forward_mode=types.SimpleNamespace(name="DECODE"),
                                   sleep_s=0.0)
    with caplog.at_level("WARNING"):
        for batch in (extend, decode, decode):
            hook(forward_batch=batch)
            forward()
    (line,) = [record.getMessage() for record in caplog.records]
    means = {name: timers_mean for name in ("CanaryRunner.on_init_new",
                                            "CanaryRunner.on_init_new[EXTEND]",
                                            "CanaryRunner.on_init_new[DECODE]")
             if (timers_mean := table.timer_mean_us(line, name)) is not None}
    assert means["CanaryRunner.on_init_new[EXTEND]"] >= 4000
    assert means["CanaryRunner.on_init_new[DECODE]"] < 1000
    assert 1000 < means["CanaryRunner.on_init_new"] < means["CanaryRunner.on_init_new[EXTEND]"]
    assert "CanaryRunner.on_init_new[EXTEND] " in line and "x0.33" in line
    # a batch given as the first argument after self (Scheduler.run_batch) is split too
    caplog.clear()
    run_batch = timers._wrap("Scheduler.run_batch",
                             lambda scheduler, batch: time.sleep(batch.sleep_s))
    with caplog.at_level("WARNING"):
        for batch in (extend, decode, decode):
            run_batch(object(), batch)
            forward()
    (line,) = [record.getMessage() for record in caplog.records]
    assert table.timer_mean_us(line, "Scheduler.run_batch[EXTEND]") >= 4000
    assert table.timer_mean_us(line, "Scheduler.run_batch[DECODE]") < 1000


def test_the_timing_sitecustomize_leaves_out_what_the_installed_code_lacks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One list serves several package versions: a missing module, class or function is skipped,
    the rest is wrapped; the shipped list names this version's extend-forward functions."""
    timers = _load_sitecustomize(monkeypatch)
    assert {"CanaryRunner.launch_before_model", "CanaryRunner._extend_expectations",
            "WriteExpectations.compute", "RequestRows.prepare_deferred"} <= {
        path for _, path in timers.TIMED}
    # the controls: scheduler functions that run no canary code, timed in every server
    assert {("sglang.srt.managers.scheduler", "Scheduler.recv_requests"),
            ("sglang.srt.managers.scheduler", "Scheduler.get_next_batch_to_run")} <= set(
        timers.TIMED)
    module = types.ModuleType("kv_canary_fake_timed")
    module.Runner = type("Runner", (), {"kept": lambda self: 1})
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(timers, "_EVERY", 1000)
    monkeypatch.setattr(timers, "_EXTRA", ())
    monkeypatch.setattr(timers, "TIMED", (
        (module.__name__, "Runner.kept"), (module.__name__, "Runner.gone"),
        (module.__name__, "Missing.f"), ("kv_canary_no_such_module", "f")))
    timers._install()
    assert module.Runner().kept() == 1 and timers._totals["Runner.kept"][1] == 1
    assert "Runner.gone" not in timers._totals and "Missing.f" not in timers._totals


def test_the_call_profile_reports_once_what_ran_inside_the_profiled_calls(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    timers = _load_sitecustomize(monkeypatch)

    def kv_canary_inner_work() -> None:
        time.sleep(0.0002)

    def kv_canary_outside_work() -> None:
        time.sleep(0.0002)

    profile = timers._CallProfile(names=("outer", "inner"), skip=2, calls=3)
    inner = profile.wrap("inner", kv_canary_inner_work)
    outer = profile.wrap("outer", lambda: (inner(), inner()))
    with caplog.at_level("WARNING"):
        for _ in range(4):
            outer()
            kv_canary_outside_work()  # never inside a profiled call
        assert not caplog.records  # two skipped, two of the three profiled so far
        for _ in range(3):
            outer()
    # one report (by own, then by cumulative time), then none
    line, by_cumulative = [record.getMessage() for record in caplog.records]
    assert line.startswith("KV canary host profile over 3 calls of outer, inner: ")
    assert by_cumulative.startswith(
        "KV canary host profile by cumulative time over 3 calls of outer, inner: ")
    assert by_cumulative.split(": ", 1)[1].split(" ")[0].endswith("(<lambda>)")  # the outer
    rows = {row.split(" ")[0].split("(")[-1].rstrip(")"): row for row in line.split(": ", 1)[1]
            .split("; ")}
    assert "kv_canary_inner_work" in rows and "kv_canary_outside_work" not in rows
    assert rows["kv_canary_inner_work"].endswith("x2.00")  # twice per outer call
    assert float(rows["kv_canary_inner_work"].split(" ")[2].rstrip("us")) >= 400
    with pytest.raises(ValueError, match="KV_CANARY_HOST_PROFILE item 'x' is invalid"):
        timers.extra_timed("x", variable="KV_CANARY_HOST_PROFILE")


# ----------------------------------------------------------------------------- configurations

def test_configs_differ_only_in_what_they_name() -> None:
    configs = bench.CONFIGS
    assert tuple(configs) == (*DEFAULT_CONFIGS[:5], *SPLIT_CONFIGS, *DEFAULT_CONFIGS[5:])
    assert configs["off"].env == {} and configs["off"].sampling_backend == "pytorch"
    assert dict(configs["stock"].env) == dict(configs["stock-piecewise"].env)
    assert "SGLANG_PLUGINS" in configs["stock"].env
    oracle = dict(configs["oracle"].env)
    assert oracle == {"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"}
    for name in ("oracle", "canary", "canary+partial", "all-checks", "all-checks-s4",
                 *SPLIT_CONFIGS):
        assert configs[name].sampling_backend == "token_oracle"
        assert oracle.items() <= dict(configs[name].env).items()
    assert dict(configs["all-checks"].env) == {
        **oracle, "SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA": "partial",
        "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
        "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1",
    }
    assert dict(configs["all-checks-s4"].env) == {
        **configs["all-checks"].env, "SGLANG_KV_CANARY_REAL_DATA_STRIDE": "4"}
    canary = dict(configs["canary"].env)
    assert dict(configs["canary+verify-token"].env) == {
        **canary, "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1"}
    assert dict(configs["canary+write-input"].env) == {
        **canary, "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1"}
    assert [name for name, config in configs.items() if config.canary_on] == [
        "all-checks", "all-checks-s4", "canary", "canary+partial", *SPLIT_CONFIGS]
    assert [name for name, config in configs.items() if config.piecewise_cuda_graph] == [
        "stock-piecewise"]


def test_every_ratio_has_a_declared_baseline() -> None:
    assert bench.BASELINES == {
        "off": "stock", "all-checks": "off", "all-checks-s4": "off", "canary": "off",
        "canary+partial": "off", "canary+verify-token": "off", "canary+write-input": "off",
        "oracle": "off", "stock": "stock-piecewise", "stock-piecewise": None}
    assert bench.VS_ORACLE == {"all-checks", "all-checks-s4", "canary", "canary+partial",
                               *SPLIT_CONFIGS}
    assert bench.baselines_line(["off", "all-checks", "stock-piecewise"]) == (
        "baselines: off: no baseline (stock not in this run); all-checks vs off; "
        "NAME#2 vs NAME#1")


def test_launch_args_name_every_flag_once() -> None:
    base, args = bench.launch_args(model=bench.MODELS["8b"], config=bench.CONFIGS["all-checks"])
    command = [*base, *args]
    flags = [arg for arg in command if arg.startswith("--")]
    assert len(flags) == len(set(flags))
    assert "--disable-piecewise-cuda-graph" in command
    assert args == ("--context-length", "40960", "--max-total-tokens", "614400",
                    "--mem-fraction-static", "0.8", "--sampling-backend", "token_oracle")
    assert command[command.index("--load-format") + 1] == "dummy"
    base, args = bench.launch_args(model=bench.MODELS["tiny"],
                                   config=bench.CONFIGS["stock-piecewise"])
    assert "--disable-piecewise-cuda-graph" not in base
    assert base[base.index("--mem-fraction-static") + 1] == "0.3"  # tiny keeps the default
    assert args[-2:] == ("--sampling-backend", "pytorch")


def test_the_8b_model_has_the_qwen3_8b_shape(tmp_path: pathlib.Path) -> None:
    directory = bench.make_model(bench.MODELS["8b"], directory=tmp_path / "8b")
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert {key: config[key] for key in (
        "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings")} == {
        "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
        "vocab_size": 151936, "max_position_embeddings": 40960}
    assert bench.MODELS["8b"].kv_bytes_per_token == 144 * 1024


# ----------------------------------------------------------------------------- workloads

def test_workloads_and_the_pool_they_need() -> None:
    by_name = workloads.WORKLOADS_BY_NAME
    assert tuple(by_name) == ALL_WORKLOADS
    assert (by_name["prefill64x512"].num_requests, by_name["prefill64x512"].prompt_tokens) == (
        64, 512)
    assert by_name["decode64_8k"].kv_tokens == 64 * (8192 + 256) <= bench.MAX_TOTAL_TOKENS
    assert by_name["bs1_32k"].context_tokens == 32768 + 256 <= bench.CONTEXT_LENGTH
    assert [name for name, w in by_name.items() if w.step_target] == ["decode64_8k"]
    assert [name for name, w in by_name.items() if w.cached_prefix_tokens] == [
        "decode64_8k", "bs1_32k", "admit64_8k"]
    assert by_name["admit64_8k"].kv_tokens <= bench.MAX_TOTAL_TOKENS
    with pytest.raises(ValueError, match="new_tokens >= 2"):
        workloads.Workload(name="x", num_requests=1, prompt_tokens=8, new_tokens=1,
                           throughput="output")
    with pytest.raises(ValueError, match="cached_prefix_tokens=8 is invalid"):
        workloads.Workload(name="x", num_requests=1, prompt_tokens=8, new_tokens=2,
                           throughput="output", cached_prefix_tokens=8)
    assert [name for name, w in by_name.items() if w.sequential_batches > 1] == ["ttft1"]
    assert (by_name["ttft1"].num_requests, by_name["ttft1"].prompt_tokens,
            by_name["ttft1"].sequential_batches) == (1, 128, 32)
    with pytest.raises(ValueError, match="sequential_batches=0 is invalid"):
        workloads.Workload(name="x", num_requests=1, prompt_tokens=8, new_tokens=2,
                           throughput="output", sequential_batches=0)


def test_round_payloads_are_streamed_distinct_per_round_and_equal_per_config() -> None:
    workload = workloads.WORKLOADS_BY_NAME["prefill32"]
    first = workloads.round_payload(workload=workload, vocab_size=4096, round_index=1)
    assert first == workloads.round_payload(workload=workload, vocab_size=4096, round_index=1)
    prompts = first["input_ids"]
    assert len(prompts) == 32 and {len(prompt) for prompt in prompts} == {2048}
    assert min(min(p) for p in prompts) >= 5 and max(max(p) for p in prompts) < 4096
    assert len({tuple(prompt[:8]) for prompt in prompts}) == 32
    second = workloads.round_payload(workload=workload, vocab_size=4096, round_index=2)
    assert not {tuple(p[:8]) for p in prompts} & {tuple(p[:8]) for p in second["input_ids"]}
    assert first["stream"] is True
    assert first["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.0,
                                        "ignore_eos": True, "stream_interval": 8}


def test_sequential_batches_have_fresh_prompts_and_the_first_keeps_the_round_s() -> None:
    workload = workloads.WORKLOADS_BY_NAME["ttft1"]
    batches = [workloads.round_payload(workload=workload, vocab_size=4096, round_index=1,
                                       batch_index=index) for index in range(32)]
    assert batches[0] == workloads.round_payload(workload=workload, vocab_size=4096,
                                                 round_index=1)
    assert len({tuple(payload["input_ids"][0]) for payload in batches}) == 32
    again = workloads.round_payload(workload=workload, vocab_size=4096, round_index=2,
                                    batch_index=5)
    assert again["input_ids"] != batches[5]["input_ids"]


def test_a_cached_prefix_is_the_same_in_every_round() -> None:
    workload = workloads.Workload(name="long", num_requests=3, prompt_tokens=40, new_tokens=4,
                                  throughput="output", cached_prefix_tokens=32)
    rounds = [workloads.round_payload(workload=workload, vocab_size=4096, round_index=index)
              for index in range(3)]
    prefixes = [[prompt[:32] for prompt in payload["input_ids"]] for payload in rounds]
    assert prefixes[0] == prefixes[1] == prefixes[2]
    assert len({tuple(prefix) for prefix in prefixes[0]}) == 3  # distinct per request
    tails = {tuple(prompt[32:]) for payload in rounds for prompt in payload["input_ids"]}
    assert len(tails) == 9


# ----------------------------------------------------------------------------- streamed answers

def _chunk(index: int, *, tokens: int, finished: bool, prompt: int = 16) -> bytes:
    meta = {"id": f"r{index}", "prompt_tokens": prompt, "completion_tokens": tokens,
            "finish_reason": {"type": "length"} if finished else None}
    return b"data: " + json.dumps({"index": index, "meta_info": meta}).encode() + b"\n"


def test_ttft_and_decode_step_from_the_stream() -> None:
    collector = workloads.StreamCollector(num_requests=2, new_tokens=5, started=10.0)
    lines = [(10.2, _chunk(1, tokens=1, finished=False)), (10.2, b"\n"), (10.2, b": ping\n"),
             (10.3, _chunk(0, tokens=1, finished=False)),
             (10.7, _chunk(1, tokens=5, finished=True)),
             (11.1, _chunk(0, tokens=5, finished=True))]
    assert all(collector.feed(line=line, at=at) for at, line in lines)
    assert collector.feed(line=b"data: [DONE]\n", at=11.2) is False
    timing = collector.timing()
    assert timing.ttft_s == pytest.approx((0.3, 0.2))
    assert timing.mean_ttft_s == pytest.approx(0.25)
    assert timing.wall_s == pytest.approx(1.2)
    assert timing.decode_s == pytest.approx(0.8)  # the last first token -> the last final chunk
    assert timing.step_ms == pytest.approx(200.0)  # 4 decode steps after the first token
    assert (timing.prompt_tokens, timing.output_tokens) == (32, 10)
    assert timing.tok_s("output") == pytest.approx(10 / 1.2)
    assert timing.tok_s("prompt") == pytest.approx(32 / 1.2)


def test_pooled_batches_sum_walls_and_tokens_keep_every_ttft_and_average_the_step() -> None:
    first = workloads.RoundTiming(wall_s=0.5, ttft_s=(0.2,), decode_s=0.2, new_tokens=3,
                                  prompt_tokens=16, output_tokens=3)
    second = workloads.RoundTiming(wall_s=0.7, ttft_s=(0.4,), decode_s=0.4, new_tokens=3,
                                   prompt_tokens=16, output_tokens=3)
    pooled = workloads.RoundTiming.pooled([first, second])
    assert pooled.wall_s == pytest.approx(1.2) and pooled.ttft_s == (0.2, 0.4)
    assert pooled.mean_ttft_s == pytest.approx(0.3)
    assert pooled.step_ms == pytest.approx(150.0)  # mean decode 0.3 s over 2 steps
    assert (pooled.prompt_tokens, pooled.output_tokens) == (32, 6)
    other = workloads.RoundTiming(wall_s=1.0, ttft_s=(0.1,), decode_s=0.1, new_tokens=4,
                                  prompt_tokens=1, output_tokens=4)
    for timings in ([], [first, other]):
        with pytest.raises(ValueError, match="same new_tokens"):
            workloads.RoundTiming.pooled(timings)


def test_a_request_finishing_in_its_first_chunk_has_its_ttft_there() -> None:
    collector = workloads.StreamCollector(num_requests=1, new_tokens=2, started=0.0)
    collector.feed(line=_chunk(0, tokens=2, finished=True), at=0.5)
    collector.feed(line=b"data: [DONE]", at=0.6)
    timing = collector.timing()
    assert timing.ttft_s == (0.5,) and timing.decode_s == 0.0


@pytest.mark.parametrize("lines,fragment", [
    ([b'data: {"error": {"message": "boom"}}'], "the server streamed an error: {'message'"),
    ([b'data: {"index": 7, "meta_info": {}}'], "a chunk has index 7; expected 0..1"),
])
def test_bad_chunks_are_errors(lines: list[bytes], fragment: str) -> None:
    collector = workloads.StreamCollector(num_requests=2, new_tokens=4, started=0.0)
    with pytest.raises(workloads.StreamError) as error:
        for line in lines:
            collector.feed(line=line, at=1.0)
    assert fragment in str(error.value)


def test_an_incomplete_stream_is_an_error() -> None:
    collector = workloads.StreamCollector(num_requests=2, new_tokens=4, started=0.0)
    collector.feed(line=_chunk(0, tokens=4, finished=True), at=1.0)
    with pytest.raises(workloads.StreamError, match=r"before data: \[DONE\]"):
        collector.timing()
    collector.feed(line=b"data: [DONE]", at=1.0)
    with pytest.raises(workloads.StreamError, match="1 of 2 requests did not stream .* request 1"):
        collector.timing()


def _fake_launch(tmp_path: pathlib.Path, **overrides: object) -> ServerLaunch:
    settings = dict(model_dir=tmp_path, log_path=tmp_path / "logs" / "server.log",
                    env={"PYTHONPATH": str(_HERE)}, server_module="fake_sglang_server",
                    ready_timeout_s=30.0, request_timeout_s=10.0, stop_timeout_s=5.0)
    settings.update(overrides)
    return ServerLaunch(**settings)


def test_rounds_stream_over_http_and_flush_as_the_workload_says(tmp_path: pathlib.Path) -> None:
    long = workloads.Workload(name="long", num_requests=3, prompt_tokens=40, new_tokens=6,
                              throughput="output", cached_prefix_tokens=32)
    short = workloads.Workload(name="short", num_requests=2, prompt_tokens=8, new_tokens=3,
                               throughput="prompt")
    serial = workloads.Workload(name="serial", num_requests=1, prompt_tokens=8, new_tokens=2,
                                throughput="output", sequential_batches=4)
    with start_server(_fake_launch(tmp_path)) as server:
        server.wait_ready()
        timings = [workloads.run_round(server, workload=workload, vocab_size=4096,
                                       round_index=index, timeout_s=10.0, clock=time.monotonic)
                   for workload in (long, short, serial) for index in range(3)]
        log = server.log_text()
    # the cached-prefix workload before its warm-up only; the others before every round
    assert log.count("POST /flush_cache") == 1 + 3 + 3
    assert log.count("POST /generate") == 3 + 3 + 3 * 4  # a serial round sends its 4 batches
    assert [len(timing.ttft_s) for timing in timings] == [3, 3, 3, 2, 2, 2, 4, 4, 4]
    assert timings[0].output_tokens == 18 and timings[0].prompt_tokens == 120
    assert timings[-1].output_tokens == 8 and timings[-1].prompt_tokens == 32
    assert all(0 < max(t.ttft_s) <= t.wall_s and 0 <= t.decode_s <= t.wall_s for t in timings)


def test_an_unreachable_server_is_a_stream_error() -> None:
    payload = workloads.round_payload(workload=workloads.WORKLOADS_BY_NAME["bs1"],
                                      vocab_size=4096, round_index=0)
    with pytest.raises(workloads.StreamError, match="POST /generate to http://127.0.0.1:9 "):
        workloads.stream_generate(base_url="http://127.0.0.1:9", payload=payload,
                                  timeout_s=2.0, clock=lambda: 0.0)


# ----------------------------------------------------------------------------- server logs

def test_pool_limits_come_from_the_scheduler_line() -> None:
    log = ("x\n[2026] max_total_num_tokens=131072, chunked_prefill_size=8192, "
           "max_prefill_tokens=16384, max_running_requests=48, context_len=4096, "
           "available_gpu_mem=37.81 GB\n")
    limits = bench.read_pool_limits(log)
    assert limits == bench.PoolLimits(kv_tokens=131072, max_running_requests=48,
                                      context_len=4096)
    by_name = workloads.WORKLOADS_BY_NAME
    assert bench.misfit(workload=by_name["decode64_8k"], limits=limits) == (
        "does not fit (KV pool 131072 tokens < 540672 needed)")
    assert bench.misfit(workload=by_name["decode64"], limits=limits) == (
        "does not fit (max_running_requests 48 < 64)")
    assert bench.misfit(workload=by_name["bs1_32k"], limits=bench.PoolLimits(
        kv_tokens=None, max_running_requests=None, context_len=4096)) == (
        "does not fit (context 4096 < 33024 tokens)")
    assert bench.misfit(workload=by_name["bs1"], limits=limits) is None
    assert bench.read_pool_limits("nothing") == bench.PoolLimits(
        kv_tokens=None, max_running_requests=None, context_len=None)


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


def test_server_note_reads_the_log() -> None:
    canary, oracle = bench.CONFIGS["canary"], bench.CONFIGS["oracle"]
    piecewise = bench.CONFIGS["stock-piecewise"]
    started = "[2026 TP0] KV canary enabled: mode=log real_data=none token_oracle=on\n"
    stats = ("[2026 TP0] KV canary stats: protected 1234 tokens (slots verified), 99 slots "
             "written, 1 violations, 100 steps\n")
    violation = ("[2026 TP0] kv_canary violation: check=pre_verify reasons=verify_position "
                 "slot=7\n")
    assert bench.server_note(config=oracle, log_text=started) == "-"
    assert bench.server_note(config=canary, log_text="nothing\n") == "canary NOT RUNNING"
    assert bench.canary_status(
        config=canary, log_text="KV canary enabled: mode=none token_oracle=on\n") == "NOT RUNNING"
    assert bench.canary_status(config=canary, log_text=started) == (
        "on, no stats line, 0 violations")
    assert bench.server_note(config=canary, log_text=started + stats + violation) == (
        "canary on, 1234 tokens checked, 1 violations")
    assert bench.server_note(config=piecewise, log_text="x") == (
        "piecewise CUDA graph NOT captured")
    assert bench.server_note(
        config=piecewise, log_text="Capture piecewise CUDA graph end. Time elapsed: 9 s") == (
        "piecewise CUDA graph captured")


# ----------------------------------------------------------------------------- the time budget

class _FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _timing(*, wall_s: float = 1.0, ttft_s: tuple[float, ...] = (0.1,), decode_s: float = 0.5,
            new_tokens: int = 11, prompt_tokens: int = 100,
            output_tokens: int = 11) -> workloads.RoundTiming:
    return workloads.RoundTiming(wall_s=wall_s, ttft_s=ttft_s, decode_s=decode_s,
                                 new_tokens=new_tokens, prompt_tokens=prompt_tokens,
                                 output_tokens=output_tokens)


def _runner(clock: _FakeClock, costs: list[float], calls: list[int]):
    """A round runner whose rounds cost ``costs`` (in order) on ``clock``."""
    def run(server: object, *, round_index: int, clock: _FakeClock, **_: object):
        calls.append(round_index)
        clock.now += costs[len(calls) - 1]
        return _timing(wall_s=costs[len(calls) - 1])
    return run


def _estimate(warm_up_s: float, round_s: float):
    return bench.WorkloadEstimate(warm_up_s=warm_up_s, round_s=round_s)


def test_measure_workload_warms_up_then_measures_what_fits() -> None:
    clock, calls = _FakeClock(), []
    bs1 = workloads.WORKLOADS_BY_NAME["bs1"]
    result = bench.measure_workload(
        None, workload=bs1, vocab_size=4096, repeats=3, timeout_s=1.0,
        deadline=bench.Deadline.after(35.0, clock=clock), estimate=_estimate(5.0, 10.0),
        round_runner=_runner(clock, [10.0, 10.0, 10.0], calls))
    assert calls == [0, 1, 2]  # warm-up (25 s left), round 1 (15 s left), round 2 (5 s left)
    assert result.status == "partial: time budget (2 of 3 rounds)"
    assert [timing.wall_s for timing in result.rounds] == [10.0, 10.0]
    assert result.warm_up.wall_s == 10.0
    assert (result.warm_up_s, result.longest_round_s) == (10.0, 10.0)
    # no measured round (a warm start's throwaway server): the warm-up only, measured
    calls.clear()
    warm_only = bench.measure_workload(
        None, workload=bs1, vocab_size=4096, repeats=0, timeout_s=1.0,
        deadline=bench.Deadline.after(35.0, clock=clock), estimate=_estimate(5.0, 10.0),
        round_runner=_runner(clock, [10.0], calls))
    assert calls == [0] and warm_only.status == bench.MEASURED and warm_only.rounds == ()


def test_measured_rounds_are_budgeted_by_rounds_not_by_the_warm_up() -> None:
    clock, calls = _FakeClock(), []
    long = workloads.WORKLOADS_BY_NAME["decode64_8k"]
    result = bench.measure_workload(
        None, workload=long, vocab_size=4096, repeats=3, timeout_s=1.0,
        deadline=bench.Deadline.after(45.0, clock=clock), estimate=_estimate(30.0, 5.0),
        round_runner=_runner(clock, [30.0, 4.0, 5.0, 4.0], calls))
    assert calls == [0, 1, 2, 3] and result.status == "measured"  # 15 s left after the warm-up
    assert (result.warm_up_s, result.longest_round_s) == (30.0, 5.0)
    clock, calls = _FakeClock(), []
    result = bench.measure_workload(
        None, workload=long, vocab_size=4096, repeats=3, timeout_s=1.0,
        deadline=bench.Deadline.after(45.0, clock=clock), estimate=_estimate(30.0, 16.0),
        round_runner=_runner(clock, [30.0], calls))
    assert calls == [0] and result.status == "skipped: time budget (after the warm-up round)"


def test_a_warm_up_that_does_not_fit_is_skipped() -> None:
    clock, calls = _FakeClock(), []
    result = bench.measure_workload(
        None, workload=workloads.WORKLOADS_BY_NAME["bs1"], vocab_size=4096, repeats=3,
        timeout_s=1.0, deadline=bench.Deadline.after(20.0, clock=clock),
        estimate=_estimate(25.0, 1.0), round_runner=_runner(clock, [], calls))
    assert calls == [] and result.status == "skipped: time budget (25 s needed, 20 s left)"
    assert result.rounds == () and result.warm_up is None


def _iterate(clock: _FakeClock, *, budget_s: float, configs: tuple[str, ...], cost_s: float,
             statuses: dict[str, str] | None = None, repeat_first: bool = True,
             seen: list | None = None, cycles: int = 1,
             startups: dict[str, float] | None = None) -> list:
    """Results of ``iter_model_results`` on the tiny model with stand-in servers that cost
    ``cost_s`` each (``startups[name]`` of it to be ready; default 0) and measure one bs1
    round (unless ``statuses`` says otherwise)."""
    def measure(*, config, run, deadline, estimates, **_: object):
        if seen is not None:
            seen.append((config.name, run, deadline.end, dict(estimates)))
        clock.now += cost_s
        status = (statuses or {}).get(config.name, "measured")
        rounds = {} if status.startswith("refused") else {"bs1": table.WorkloadResult(
            workload="bs1", status="measured", rounds=(_timing(),), warm_up=_timing(),
            warm_up_s=7.0, longest_round_s=3.0)}
        return table.ConfigResult(config=config.name, run=run, status=status, workloads=rounds,
                                  duration_s=cost_s,
                                  startup_s=(startups or {}).get(config.name, 0.0))

    return list(bench.iter_model_results(
        model=bench.MODELS["tiny"], model_dir=pathlib.Path("unused"),
        configs=[bench.CONFIGS[name] for name in configs],
        workloads=[workloads.WORKLOADS_BY_NAME["bs1"]], repeats=3,
        deadline=bench.Deadline.after(budget_s, clock=clock), log_dir=pathlib.Path("unused"),
        repeat_first=repeat_first, cycles=cycles, measure=measure))


def test_the_first_configuration_is_repeated_at_the_end() -> None:
    clock, seen = _FakeClock(), []
    results = _iterate(clock, budget_s=1000.0, configs=("off", "all-checks", "canary"),
                       cost_s=100.0, seen=seen)
    assert [(r.label, r.run) for r in results] == [
        ("off", 1), ("all-checks", 1), ("canary", 1), ("off#2", 2)]
    first_estimate = bench.MODELS["tiny"].first_config_estimate_s(
        workloads=[workloads.WORKLOADS_BY_NAME["bs1"]], repeats=3)
    assert first_estimate == pytest.approx(110.0 + 1.0 + 3 * 0.8)
    end = 1000.0 + 1000.0
    # the third server measures against a deadline earlier by the last server's duration
    assert [entry[2] for entry in seen] == [end, end, end - 100.0, end]
    assert seen[0][3] == {}  # the model's estimates; then what the last server measured
    assert seen[1][3] == {"bs1": bench.WorkloadEstimate(warm_up_s=7.0, round_s=3.0)}


def test_cycles_start_every_configuration_in_turn_and_rows_pool_their_servers() -> None:
    results = _iterate(_FakeClock(), budget_s=1000.0, configs=("off", "all-checks"),
                       cost_s=10.0, cycles=3)
    assert [(r.label, r.run) for r in results] == [
        ("off", 1), ("all-checks", 1), ("off#2", 2), ("all-checks#2", 2), ("off#3", 3),
        ("all-checks#3", 3)]  # no repeat of the first configuration at the end
    rows = table.workload_rows(workload=workloads.WORKLOADS_BY_NAME["bs1"], results=results,
                               baselines=bench.BASELINES, vs_oracle=bench.VS_ORACLE)
    assert [(row.label, row.baseline, row.tok_s.samples) for row in rows] == [
        ("off", "stock", 3), ("all-checks", "off", 3), ("off#2", "off#1", 1),
        ("all-checks#2", "all-checks#1", 1), ("off#3", "off#1", 1),
        ("all-checks#3", "all-checks#1", 1)]


def test_budget_skips_what_no_longer_fits_and_keeps_time_for_the_repeat() -> None:
    clock = _FakeClock()
    results = _iterate(clock, budget_s=350.0,
                       configs=("off", "all-checks", "canary", "oracle"), cost_s=100.0)
    # off: 113 s estimated <= 350; all-checks: 100 <= 250 (nothing kept for the second
    # server); canary: 100 + 100 kept > 150 left; oracle likewise; off#2: 100 <= 150.
    assert [(r.label, r.status) for r in results] == [
        ("off", "measured"), ("all-checks", "measured"),
        ("canary", "skipped: time budget (100 s needed + 100 s kept for off#2, 150 s left)"),
        ("oracle", "skipped: time budget (100 s needed + 100 s kept for off#2, 150 s left)"),
        ("off#2", "measured")]


def test_the_repeat_is_skipped_when_the_first_or_every_other_server_measured_nothing() -> None:
    results = _iterate(_FakeClock(), budget_s=1000.0, configs=("all-checks", "off"),
                       cost_s=10.0, statuses={"all-checks": "refused: CanaryConfigError: x"})
    assert [(r.label, r.status) for r in results] == [
        ("all-checks", "refused: CanaryConfigError: x"), ("off", "measured"),
        ("all-checks#2", "skipped: the first server of this configuration measured nothing")]
    results = _iterate(_FakeClock(), budget_s=1000.0, configs=("off", "all-checks"),
                       cost_s=10.0, statuses={"all-checks": "refused: CanaryConfigError: x"})
    assert results[-1].status == "skipped: no other server measured anything"
    results = _iterate(_FakeClock(), budget_s=1000.0, configs=("off", "all-checks"),
                       cost_s=10.0, repeat_first=False)
    assert [r.label for r in results] == ["off", "all-checks"]
    assert [r.label for r in _iterate(_FakeClock(), budget_s=1000.0, configs=("off",),
                                      cost_s=10.0)] == ["off"]


def test_a_cold_first_start_up_does_not_crowd_out_the_next_server() -> None:
    """A fresh machine's first server starts cold (the 8B model's once took 187 s, the next
    103 s): the next estimate counts start-up as the quickest seen or the model's estimate
    (110 s for the tiny model), not the cold one."""
    results = _iterate(_FakeClock(), budget_s=549.0, configs=("off", "all-checks"),
                       cost_s=278.0, startups={"off": 187.0}, repeat_first=False)
    # all-checks: 278 - 187 + 110 = 201 s <= 271 s left (278 s counted whole would not fit)
    assert [(r.label, r.status) for r in results] == [
        ("off", "measured"), ("all-checks", "measured")]
    results = _iterate(_FakeClock(), budget_s=450.0, configs=("off", "all-checks"),
                       cost_s=278.0, startups={"off": 187.0}, repeat_first=False)
    assert results[-1].status == "skipped: time budget (201 s needed, 172 s left)"
    results = _iterate(_FakeClock(), budget_s=260.0, configs=("off", "all-checks"),
                       cost_s=100.0, startups={"off": 40.0, "all-checks": 90.0}, cycles=2)
    # quicker than the model's estimate, the quickest start-up seen counts: off#2 needs
    # 100 - 90 + 40 = 50 s of the 60 s left; all-checks#2 100 - 40 + 40 s
    assert [r.status for r in results] == [
        "measured", "measured", "measured", "skipped: time budget (100 s needed, 0 s left)"]


def test_a_refused_config_does_not_set_the_estimate() -> None:
    results = _iterate(_FakeClock(), budget_s=120.0, configs=("all-checks", "off"),
                       cost_s=10.0, statuses={"all-checks": "refused: X"}, repeat_first=False)
    assert [result.status for result in results] == [
        "refused: X", "skipped: time budget (113 s needed, 110 s left)"]


# ----------------------------------------------------------------------------- one real server

def test_measure_config_against_a_stand_in_server(tmp_path: pathlib.Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_HERE))
    monkeypatch.setenv("FAKE_SERVER_MAX_TOTAL_TOKENS", "100000")
    model = bench.MODELS["tiny"]
    chosen = [workloads.WORKLOADS_BY_NAME[name] for name in ("bs1", "decode64_8k")]
    result = bench.measure_config(
        model=model, model_dir=bench.make_model(model, directory=tmp_path / "model"),
        config=bench.CONFIGS["canary"], run=2, workloads=chosen, repeats=2,
        deadline=bench.Deadline.after(60.0), log_dir=tmp_path / "logs", estimates={},
        server_module="fake_sglang_server")
    assert result.status == "measured" and result.label == "canary#2"
    assert result.log_path == str(tmp_path / "logs" / "tiny-canary-run2.log")
    assert pathlib.Path(result.log_path).is_file()
    assert result.command[1:3] == ("-m", "fake_sglang_server")
    assert result.command[-2:] == ("--sampling-backend", "token_oracle")
    assert (result.kv_pool_tokens, result.max_running_requests) == (100000, 2048)
    assert result.server_note.startswith("canary on")
    bs1 = result.workloads["bs1"]
    assert bs1.status == "measured" and len(bs1.rounds) == 2 and bs1.warm_up is not None
    assert bs1.rounds[0].output_tokens == 512 and len(bs1.rounds[0].ttft_s) == 1
    assert result.workloads["decode64_8k"].status == (
        "skipped: does not fit (KV pool 100000 tokens < 540672 needed)")
    assert bs1.host_timers == "" and bench.host_timers_report(result) == []
    # the stand-in has no process titled sglang::scheduler: steal is read, the scheduler is not
    assert bs1.cpu is not None and bs1.cpu.steal_all is not None
    assert bs1.cpu.scheduler_on_cpu is None and bs1.cpu.steal_scheduler is None
    assert bench.cpu_report(result) == [f"canary#2 bs1 cpu: {bs1.cpu.describe()}"]
    assert result.workloads["decode64_8k"].cpu is None  # skipped: nothing ran


def test_each_workload_keeps_the_last_timer_line_logged_while_it_ran(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_HERE))
    monkeypatch.setenv("FAKE_SERVER_TIMER_LINES", "1")
    monkeypatch.setenv("FAKE_SERVER_MAX_TOTAL_TOKENS", "100000")  # decode64_8k does not fit
    model = bench.MODELS["tiny"]
    chosen = [workloads.WORKLOADS_BY_NAME[name] for name in ("bs1", "decode64", "decode64_8k")]
    result = bench.measure_config(
        model=model, model_dir=bench.make_model(model, directory=tmp_path / "model"),
        config=bench.CONFIGS["off"], run=1, workloads=chosen, repeats=1,
        deadline=bench.Deadline.after(60.0), log_dir=tmp_path / "logs", estimates={},
        server_module="fake_sglang_server")
    new_tokens = {name: workloads.WORKLOADS_BY_NAME[name].new_tokens
                  for name in ("bs1", "decode64")}
    assert new_tokens["bs1"] != new_tokens["decode64"]
    for name, tokens in new_tokens.items():
        assert result.workloads[name].host_timers == (
            f"KV canary host timers over 1 forwards: fake.new_tokens {tokens}.0us x1.00")
    assert result.workloads["decode64_8k"].host_timers == ""  # skipped: it did not fit
    assert bench.host_timers_report(result) == [
        f"off {name}: {result.workloads[name].host_timers}" for name in ("bs1", "decode64")]
    again = table.ConfigResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again.workloads["bs1"].host_timers == result.workloads["bs1"].host_timers



# ----------------------------------------------------------------------------- servers together

def _together_plan(*names_and_runs: tuple[str, int]) -> list[tuple[bench.ServerConfig, int]]:
    return [(bench.CONFIGS[name], run) for name, run in names_and_runs]


def test_the_run_plan_is_every_configuration_in_turn_then_the_first_again() -> None:
    configs = [bench.CONFIGS["off"], bench.CONFIGS["all-checks"]]
    labels = lambda plan: [f"{config.name}#{run}" for config, run in plan]  # noqa: E731
    assert labels(bench.run_plan(configs=configs, cycles=1, repeat_first=True)) == [
        "off#1", "all-checks#1", "off#2"]
    assert labels(bench.run_plan(configs=configs, cycles=2, repeat_first=True)) == [
        "off#1", "all-checks#1", "off#2", "all-checks#2"]
    assert labels(bench.run_plan(configs=configs[:1], cycles=1, repeat_first=True)) == ["off#1"]


def test_servers_together_run_at_once_and_take_their_rounds_in_turn(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_HERE))
    monkeypatch.setenv("FAKE_SERVER_TIMER_LINES", "1")
    model = bench.MODELS["tiny"]
    plan = _together_plan(("off", 1), ("all-checks", 1), ("off", 2))
    calls: list[tuple[str, int]] = []
    servers: dict[str, object] = {}
    alive_at_first_round: list[bool] = []

    def runner(server, *, round_index: int, **kwargs: object) -> workloads.RoundTiming:
        name = pathlib.Path(server.launch.log_path).stem
        servers[name] = server
        if round_index == 1 and not alive_at_first_round:
            alive_at_first_round.append(
                all(other.returncode is None for other in servers.values()))
        calls.append((name, round_index))
        return workloads.run_round(server, round_index=round_index, **kwargs)

    results = bench.measure_together(
        model=model, model_dir=bench.make_model(model, directory=tmp_path / "model"),
        plan=plan, workloads=[workloads.WORKLOADS_BY_NAME["bs1"]], repeats=3,
        deadline=bench.Deadline.after(120.0), log_dir=tmp_path / "logs",
        round_runner=runner, server_module="fake_sglang_server")
    assert [result.label for result in results] == ["off", "all-checks", "off#2"]
    assert all(result.status == bench.MEASURED for result in results)
    names = ["tiny-off-run1", "tiny-all-checks-run1", "tiny-off-run2"]
    # warm-ups in plan order, then each round with the order rotated by one
    assert calls == [(name, 0) for name in names] + [
        (names[0], 1), (names[1], 1), (names[2], 1),
        (names[1], 2), (names[2], 2), (names[0], 2),
        (names[2], 3), (names[0], 3), (names[1], 3)]
    for result in results:
        bs1 = result.workloads["bs1"]
        assert bs1.status == bench.MEASURED and len(bs1.rounds) == 3 and bs1.warm_up
        assert bs1.host_timers.startswith("KV canary host timers over 1 forwards")
        assert result.startup_s > 0 and result.command[1:3] == ("-m", "fake_sglang_server")
    # all three were up at the first measured round, and all are stopped now
    assert alive_at_first_round == [True] and len(servers) == 3
    assert all(server.returncode is not None for server in servers.values())
    assert len({result.duration_s for result in results}) == 1


def test_a_server_whose_round_fails_is_left_out_and_the_budget_bounds_the_sweeps(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_HERE))
    model = bench.MODELS["tiny"]
    clock = _FakeClock()
    calls: list[tuple[str, int]] = []

    def runner(server, *, round_index: int, clock: _FakeClock, **_: object):
        name = pathlib.Path(server.launch.log_path).stem
        calls.append((name, round_index))
        if name == "tiny-all-checks-run1" and round_index == 1:
            raise workloads.StreamError("the server went away\nmore")
        clock.now += 10.0
        return _timing(wall_s=10.0)

    deadline = bench.Deadline.after(
        model.warm_up_estimate_s["bs1"] * 2 + 45.0, clock=clock)
    results = bench.measure_together(
        model=model, model_dir=bench.make_model(model, directory=tmp_path / "model"),
        plan=_together_plan(("off", 1), ("all-checks", 1)),
        workloads=[workloads.WORKLOADS_BY_NAME["bs1"]], repeats=5, deadline=deadline,
        log_dir=tmp_path / "logs", round_runner=runner, server_module="fake_sglang_server")
    off, checks = results
    assert checks.status == "failed: the server went away"
    assert off.status == "partial: time budget"
    # warm-ups (20 s), then sweeps while the longest sweep so far still fits
    assert [round_index for name, round_index in calls if name == "tiny-off-run1"] == [
        0, 1, 2]
    assert [round_index for name, round_index in calls if name != "tiny-off-run1"] == [0, 1]
    assert off.workloads["bs1"].status == "partial: time budget (2 of 5 rounds)"
    assert checks.workloads["bs1"].rounds == ()


def test_pinned_servers_together_run_every_round_on_the_measuring_core(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_HERE))
    model = bench.MODELS["tiny"]
    plan = _together_plan(("off", 1), ("all-checks", 1))
    pinning = bench.together_pinning(servers=len(plan), allowed=range(8))
    events: list[tuple[str, str]] = []
    where = {pinning.measuring: "measuring", pinning.parked[0]: "parked 0",
             pinning.parked[1]: "parked 1"}

    def pin(*, pids: list[int], plan: bench.PinningPlan) -> list[int]:
        events.append((str(sorted(pids)[0]), where[plan]))
        return pids[:1]

    def runner(server, *, round_index: int, **_: object) -> workloads.RoundTiming:
        events.append((str(sorted(server.live_pids())[0]), f"round {round_index}"))
        return _timing()

    monkeypatch.setattr(bench, "pin_server", pin)
    results = bench.measure_together(
        model=model, model_dir=bench.make_model(model, directory=tmp_path / "model"),
        plan=plan, workloads=[workloads.WORKLOADS_BY_NAME["bs1"]], repeats=1,
        deadline=bench.Deadline.after(60.0), log_dir=tmp_path / "logs",
        round_runner=runner, server_module="fake_sglang_server", pinning=pinning)
    first, second = (events[0][0], events[1][0])
    assert events == [
        (first, "parked 0"), (second, "parked 1"),  # once ready
        *[(pid, step) for pid, parked in ((first, "parked 0"), (second, "parked 1"))
          for step in ("measuring", "round 0", parked)],  # warm-ups
        *[(pid, step) for pid, parked in ((first, "parked 0"), (second, "parked 1"))
          for step in ("measuring", "round 1", parked)]]
    assert results[0].placement.endswith(
        f"; its rounds: scheduler on CPUs {bench._cpu_names(pinning.measuring)}")


def test_the_together_pinning_keeps_a_measuring_core_apart_from_the_parked_ones() -> None:
    allowed = range(64)
    pinning = bench.together_pinning(servers=3, allowed=allowed)
    cores = [pinning.measuring.scheduler_cpus,
             *(plan.scheduler_cpus for plan in pinning.parked)]
    assert len(pinning.parked) == 3
    assert all(not (a & b) for index, a in enumerate(cores) for b in cores[index + 1:])
    rest = set(allowed) - set().union(*cores)
    assert all(plan.other_cpus == rest for plan in (pinning.measuring, *pinning.parked))
    assert pinning.describe().startswith(
        f"every round's scheduler on CPUs {bench._cpu_names(pinning.measuring)}, the "
        "schedulers waiting on CPUs ")
    assert bench.together_pinning(servers=3, allowed=range(3)) is None

def test_main_measures_a_together_model_with_its_whole_plan_at_once(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[list[str]] = []

    def together(*, plan, pinning, **_: object) -> list[table.ConfigResult]:
        seen.append([f"{config.name}#{run}" for config, run in plan])
        assert pinning is None
        return [table.ConfigResult(config=config.name, run=run, status=bench.MEASURED)
                for config, run in plan]

    def measure(**_: object) -> table.ConfigResult:
        raise AssertionError("a --together model is not measured one server at a time")

    out = tmp_path / "bench.json"
    assert bench.main(["--models", "tiny", "--configs", "off,all-checks", "--workloads", "bs1",
                       "--cycles", "2", "--together", "tiny", "--out", str(out),
                       "--log-dir", str(tmp_path / "logs")],
                      measure=measure, together=together) == 0
    assert seen == [["off#1", "all-checks#1", "off#2", "all-checks#2"]]
    assert "[tiny] 4 servers together, measured interleaved" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["options"]["together"] == ["tiny"]
    assert [r["label"] for r in report["models"]["tiny"]["results"]] == [
        "off", "all-checks", "off#2", "all-checks#2"]


# ----------------------------------------------------------------------------- the table

def _measured(name: str, *, run: int = 1, tok_s: tuple[float, ...], ttft_ms: tuple[float, ...],
              step_ms: tuple[float, ...], note: str = "-") -> table.ConfigResult:
    """A server whose bs1-shaped rounds give these output tok/s, mean TTFT and ms/step."""
    rounds = tuple(_timing(wall_s=11 / rate, ttft_s=(ttft / 1e3,), decode_s=step * 10 / 1e3)
                   for rate, ttft, step in zip(tok_s, ttft_ms, step_ms))
    return table.ConfigResult(
        config=name, run=run, status="measured", server_note=note,
        workloads={"w": table.WorkloadResult(workload="w", status="measured", rounds=rounds)})


_W = workloads.Workload(name="w", num_requests=1, prompt_tokens=100, new_tokens=11,
                        throughput="output", step_target=True)


def _fake_results() -> list[table.ConfigResult]:
    return [
        _measured("off", tok_s=(100.0, 100.0), ttft_ms=(10.0, 10.0), step_ms=(5.0, 5.0)),
        _measured("all-checks", tok_s=(98.0, 99.0, 97.0), ttft_ms=(10.5, 10.5, 10.5),
                  step_ms=(5.2, 5.2, 5.2), note="canary on, 9 tokens checked, 0 violations"),
        _measured("oracle", tok_s=(99.0,), ttft_ms=(10.0,), step_ms=(5.1,)),
        table.ConfigResult(config="canary", status="refused: CanaryConfigError: not wired"),
        _measured("off", run=2, tok_s=(90.0, 110.0), ttft_ms=(11.0, 9.0), step_ms=(5.0, 5.0)),
    ]


def test_servers_measured_together_are_compared_round_by_round() -> None:
    results = [
        _measured("off", tok_s=(100.0, 50.0, 80.0), ttft_ms=(10.0,) * 3, step_ms=(5.0,) * 3),
        _measured("all-checks", tok_s=(90.0, 45.0, 80.0), ttft_ms=(10.0,) * 3,
                  step_ms=(5.0,) * 3),
        _measured("off", run=2, tok_s=(200.0, 100.0), ttft_ms=(10.0,) * 2, step_ms=(5.0,) * 2),
        _measured("all-checks", run=2, tok_s=(100.0, 100.0), ttft_ms=(10.0,) * 2,
                  step_ms=(5.0,) * 2),
    ]
    checks, off_again, checks_again = table.round_pairs(
        workload=_W, results=results, baselines=bench.BASELINES)
    # run 1 round by round, then run 2 (its third round is missing on both)
    assert (checks.config, checks.baseline) == ("all-checks", "off")
    assert checks.ratios == pytest.approx((0.9, 0.9, 1.0, 0.5, 1.0))
    assert (off_again.config, off_again.baseline) == ("off#k", "off#1")
    assert off_again.ratios == pytest.approx((2.0, 2.0))
    assert checks_again.ratios == pytest.approx((100 / 90, 100 / 45))
    assert checks.describe() == (
        "all-checks / off median 0.900, quartiles 0.900..1.000 over 5 rounds")
    block = table.format_workload_table(workload=_W, rows=[], verdicts=[], notes=[],
                                        by_round=[checks])
    assert block.splitlines()[-1] == (
        "  by round (servers measured together: each round over the same round of the "
        "baseline's server of the same run, seconds apart; tok/s): " + checks.describe())
    # the throughput target on the round-by-round ratios; other metrics are not paired
    targets = [table.Target(config="all-checks", metric="tok_s", bound=0.92, at_most=False),
               table.Target(config="all-checks", metric="ttft", bound=1.03, at_most=True),
               table.Target(config="canary", metric="tok_s", bound=0.5, at_most=False)]
    verdicts = table.check_round_targets(by_round=[checks, off_again], targets=targets,
                                         baselines=bench.BASELINES)
    assert verdicts == [
        "all-checks tok/s >= 0.92x: 0.900 (quartiles 0.900..1.000) MISSED (within quartiles)"]
    lower = dataclasses.replace(targets[0], bound=0.85)
    assert table.check_round_targets(by_round=[checks], targets=[lower],
                                     baselines=bench.BASELINES) == [
        "all-checks tok/s >= 0.85x: 0.900 (quartiles 0.900..1.000) met"]
    block = table.format_workload_table(workload=_W, rows=[], verdicts=[], notes=[],
                                        by_round=[checks], round_verdicts=verdicts)
    assert block.splitlines()[-1] == "  targets by round: " + verdicts[0]
    # a run measured one server at a time prints no such line
    model = bench.MODELS["tiny"]
    assert bench.model_tables(model=model, workloads=[_W], results=results)["w"]["by_round"] == []
    together = bench.model_tables(model=model, workloads=[_W], results=results,
                                  together=True)["w"]
    assert len(together["by_round"]) == 3
    assert together["round_verdicts"] == [
        "all-checks tok/s >= 0.92x: 0.900 (quartiles 0.900..1.000) MISSED (within quartiles)"]

def test_rows_compare_with_the_declared_baseline_pooled_over_its_servers() -> None:
    off, checks, oracle, refused, again = table.workload_rows(
        workload=_W, results=_fake_results(), baselines=bench.BASELINES,
        vs_oracle=bench.VS_ORACLE)
    assert (off.label, off.baseline, off.tok_s_ratio) == ("off", "stock", None)
    # a configuration's row pools its servers too: (100, 100, 90, 110)
    assert off.tok_s.median == pytest.approx(100.0) and off.tok_s.relative_spread == 0.2
    assert off.tok_s.samples == 4
    # all-checks vs both off servers pooled: tok/s (100, 100, 90, 110) -> median 100, spread 20%
    assert checks.baseline == "off"
    assert checks.tok_s_ratio.median == pytest.approx(0.98)
    assert checks.tok_s_ratio.relative_spread == pytest.approx(2 / 98 + 0.2)
    assert checks.tok_s_ratio.half_width == pytest.approx(0.98 * (2 / 98 + 0.2) / 2)
    assert checks.ttft_ratio.median == pytest.approx(1.05)
    assert checks.step_added_ms.value == pytest.approx(0.2)
    assert checks.tok_s_vs_oracle.median == pytest.approx(98 / 99)
    assert oracle.tok_s_vs_oracle is None and oracle.baseline == "off"
    assert refused.tok_s is None and refused.tok_s_ratio is None
    assert (again.label, again.baseline) == ("off#2", "off#1")  # drift: vs the first server
    assert again.tok_s_ratio.median == pytest.approx(1.0)
    assert again.tok_s_ratio.relative_spread == pytest.approx(0.2)


def test_targets_get_a_verdict_with_the_noise_beside_it() -> None:
    rows = table.workload_rows(workload=_W, results=_fake_results(), baselines=bench.BASELINES,
                               vs_oracle=bench.VS_ORACLE)
    verdicts = table.check_targets(workload=_W, rows=rows, targets=bench.MODELS["8b"].targets)
    assert [verdict.describe() for verdict in verdicts] == [
        "all-checks tok/s >= 0.985x: 0.980 ±0.108 MISSED (within noise)",
        "all-checks TTFT <= 1.03x: 1.050 ±0.105 MISSED (within noise)",
        "all-checks +ms/step <= 0.1 ms: 0.200 ±0.000 MISSED",
        "canary tok/s >= 0.995x: not measured"]
    no_step = workloads.Workload(name="w", num_requests=1, prompt_tokens=100, new_tokens=11,
                                 throughput="output")
    assert [verdict.target for verdict in table.check_targets(
        workload=no_step, rows=rows, targets=bench.MODELS["tiny"].targets)] == [
        "all-checks tok/s >= 0.92x"]


def test_table_text() -> None:
    results = _fake_results()
    rows = table.workload_rows(workload=_W, results=results, baselines=bench.BASELINES,
                               vs_oracle=bench.VS_ORACLE)
    verdicts = table.check_targets(workload=_W, rows=rows, targets=bench.MODELS["tiny"].targets)
    text = table.format_workload_table(workload=_W, rows=rows, verdicts=verdicts,
                                       notes=table.workload_notes(workload=_W, results=results))
    lines = text.splitlines()
    assert lines[0] == "w: 1 x 100-token prompts, 11 new tokens; throughput = output tok/s"
    assert lines[1].split() == ["config", "vs", "tok/s", "x", "vs", "TTFT", "ms", "x", "vs",
                                "ms/step", "+ms", "vs", "tok/s", "x", "oracle", "server", "log"]
    assert lines[2].split() == ["off", "stock", "100", "±10.0%", "-", "10.0", "±10.0%", "-",
                                "5.000", "±0.0%", "-", "-", "-"]  # both off servers pooled
    assert lines[3].split() == [
        "all-checks", "off", "98", "±1.0%", "0.980", "±0.108", "10.5", "±0.0%", "1.050",
        "±0.105", "5.200", "±0.0%", "+0.200", "±0.000", "0.990", "±0.010", "canary", "on,", "9",
        "tokens", "checked,", "0", "violations"]
    assert lines[5].split() == ["canary", "off"] + ["-"] * 8
    assert lines[6].split()[:6] == ["off#2", "off#1", "100", "±10.0%", "1.000", "±0.100"]
    server_log = lines[1].index("server log")  # every column aligned: the last starts together
    assert all(line[server_log - 2:server_log] == "  " and line[server_log] != " "
               for line in lines[1:7])
    assert lines[7] == "  targets: all-checks tok/s >= 0.92x: 0.980 ±0.108 met (within noise)"
    assert lines[8] == "  note: canary: refused: CanaryConfigError: not wired"


def test_model_report_names_baselines_noise_and_every_workload() -> None:
    results = [_measured("off", tok_s=(1.0,), ttft_ms=(1.0,), step_ms=(1.0,))]
    results[0] = table.ConfigResult(config="off", status="partial: time budget",
                                    workloads={"bs1": results[0].workloads["w"]})
    text = bench.format_model_report(
        model=bench.MODELS["tiny"], workloads=[workloads.WORKLOADS_BY_NAME[name]
                                               for name in ("bs1", "decode64")],
        results=results, repeats=3)
    assert text.splitlines()[0].startswith("== tiny: llama, 4 layers, hidden 256")
    assert "median of 3 measured rounds per workload" in text.splitlines()[0]
    assert "stock-piecewise: without --disable-piecewise-cuda-graph" in text
    assert "baselines: off: no baseline (stock not in this run)" in text
    assert table.NOISE_NOTE in text
    assert "\nbs1: 1 x 128-token prompts" in text and "\ndecode64: 64 x 128-token" in text
    assert "  note: off: partial: time budget" in text  # decode64 was never started
    assert text.endswith("server off: partial: time budget")


def test_progress_line() -> None:
    timing = _timing(wall_s=2.0, ttft_s=(0.02, 0.04), decode_s=1.0, new_tokens=11,
                     output_tokens=22)
    slower = _timing(wall_s=4.0, ttft_s=(0.09,), decode_s=3.0, new_tokens=11, output_tokens=22)
    result = table.ConfigResult(
        config="canary", status="measured", startup_s=30.0, duration_s=60.0,
        kv_pool_tokens=614400, server_note="canary on, 9 tokens checked, 0 violations",
        workloads={"bs1": table.WorkloadResult(workload="bs1", status="measured",
                                               rounds=(timing, timing, slower)),
                   "decode64_8k": table.WorkloadResult(
                       workload="decode64_8k", status="skipped: does not fit (x)")})
    assert bench.progress_line(model=bench.MODELS["8b"], result=result) == (
        "[8b] canary: measured; ready in 30 s, done in 60 s; KV pool 614400 tokens; bs1 11 "
        "output tok/s, TTFT 30.0 ms, 100.000 ms/step (median of 3 rounds); decode64_8k "
        "skipped: does not fit (x); canary on, 9 tokens checked, 0 violations")


def test_json_report_holds_every_number() -> None:
    options = bench.parse_args(["--models", "tiny", "--configs", "off,all-checks,oracle,canary",
                                "--workloads", "bs1"])
    results = _fake_results()
    for index, result in enumerate(results):
        if "w" in result.workloads:
            workloads_ = {"bs1": table.WorkloadResult(
                workload="bs1", status="measured", rounds=result.workloads["w"].rounds)}
            results[index] = table.ConfigResult(config=result.config, run=result.run,
                                                status=result.status, workloads=workloads_,
                                                command=("python", "-m", "x"),
                                                log_path=f"/logs/{result.label}.log")
    report = json.loads(json.dumps(bench.report_json(options=options,
                                                     results={"tiny": results})))
    assert report["options"]["configs"] == ["off", "all-checks", "oracle", "canary"]
    assert set(report["configs"]) == {"off", "all-checks", "oracle", "canary"}
    assert report["configs"]["all-checks"]["baseline"] == "off"
    assert report["workloads"]["bs1"]["kv_tokens"] == 640
    tiny = report["models"]["tiny"]
    assert tiny["shape"]["num_layers"] == 4
    assert "--disable-piecewise-cuda-graph" in tiny["server_args"]["off"]
    assert [r["label"] for r in tiny["results"]] == [
        "off", "all-checks", "oracle", "canary", "off#2"]
    first = tiny["results"][0]
    assert first["command"] == ["python", "-m", "x"] and first["log_path"] == "/logs/off.log"
    assert first["workloads"]["bs1"]["rounds"][0]["ttft_s"] == [0.01]
    assert first["workloads"]["bs1"]["rounds"][0]["step_ms"] == pytest.approx(5.0)
    rows = tiny["tables"]["bs1"]["rows"]
    assert rows[1]["label"] == "all-checks"
    assert rows[1]["tok_s_ratio"]["median"] == pytest.approx(0.98)
    assert rows[1]["tok_s_ratio"]["samples"] == 3
    assert tiny["tables"]["bs1"]["verdicts"][0]["target"] == "all-checks tok/s >= 0.92x"
    assert tiny["tables"]["bs1"]["notes"] == ["canary: refused: CanaryConfigError: not wired"]
    assert "noise" in report and report["sglang_version"]


def test_pairs_compare_each_server_with_the_baseline_server_started_before_it() -> None:
    # cycles: off, all-checks, off, all-checks; the second off server is 20 % faster
    results = [
        _measured("off", tok_s=(100.0, 100.0), ttft_ms=(10.0, 10.0), step_ms=(5.0, 5.0)),
        _measured("all-checks", tok_s=(90.0, 92.0), ttft_ms=(11.0, 11.0), step_ms=(5.5, 5.5)),
        _measured("off", run=2, tok_s=(120.0, 120.0), ttft_ms=(8.0, 8.0), step_ms=(4.0, 4.0)),
        _measured("all-checks", run=2, tok_s=(108.0, 108.0), ttft_ms=(9.0, 9.0),
                  step_ms=(4.6, 4.6)),
    ]
    first, second = table.paired_comparisons(workload=_W, results=results,
                                             baselines=bench.BASELINES)
    assert (first.label, first.baseline) == ("all-checks#1", "off#1")
    assert first.tok_s_ratio.median == pytest.approx(0.91)
    assert first.tok_s_ratio.relative_spread == pytest.approx(2 / 91)
    assert first.ttft_ratio.median == pytest.approx(1.1)
    assert first.step_added_ms.value == pytest.approx(0.5)
    assert (second.label, second.baseline) == ("all-checks#2", "off#2")
    assert second.tok_s_ratio.median == pytest.approx(0.9)  # the pooled row says 99 / 110
    assert second.step_added_ms.value == pytest.approx(0.6)
    assert second.describe() == (
        "all-checks#2 / off#2 0.900 ±0.000, TTFT 1.125 ±0.000 (p50 x1.125), +0.600 ±0.000 "
        "ms/step")
    text = table.format_workload_table(workload=_W, rows=[], verdicts=[], notes=["n"],
                                       pairs=[first, second])
    assert text.splitlines()[-2] == (
        "  pairs (each server vs the baseline server started just before it; tok/s): "
        + first.describe() + "; " + second.describe())
    assert text.splitlines()[-1] == "  note: n"


def test_the_ttft_distribution_line_shows_each_server_s_requests_and_pooled_medians() -> None:
    """Per-request TTFT percentiles per server: one slow stretch moves a round's mean but not
    the requests' median, and a p90 far above the p50 shows the stretch."""
    def server(name: str, ttfts_ms: tuple[float, ...], *, run: int = 1) -> table.ConfigResult:
        timing = _timing(wall_s=1.0, ttft_s=tuple(t / 1e3 for t in ttfts_ms), decode_s=0.1)
        return table.ConfigResult(
            config=name, run=run, status="measured", server_note="-",
            workloads={"w": table.WorkloadResult(workload="w", status="measured",
                                                 rounds=(timing,))})

    off = server("off", (10.0,) * 10)
    # nine requests at 10.5 ms, one caught in a 100 ms stall: mean 19.45, median 10.5
    checks = server("all-checks", (10.5,) * 9 + (100.0,))
    assert table.ttft_percentiles_ms([10.5] * 9 + [100.0]) == pytest.approx((10.5, 10.5, 19.45))
    assert table.ttft_percentiles_ms([7.0]) == (7.0, 7.0, 7.0)
    line = table.ttft_distribution_line(workload=_W, results=[off, checks],
                                        baselines=bench.BASELINES)
    assert line == (
        "  TTFT per request (ms, p10/p50/p90 over every request of a server's measured rounds): "
        "off 10.0/10.0/10.0, all-checks 10.5/10.5/19.4; pooled medians: all-checks / off x1.050")
    (pair,) = table.paired_comparisons(
        workload=_W, results=[off, checks, server("off", (10.0,) * 10, run=2)],
        baselines=bench.BASELINES)
    assert pair.ttft_ratio.median == pytest.approx(1.945)
    assert pair.ttft_p50_ratio == pytest.approx(1.05)
    assert table.ttft_distribution_line(workload=_W, results=[],
                                        baselines=bench.BASELINES) is None
    text = table.format_workload_table(workload=_W, rows=[], verdicts=[], notes=[],
                                       ttft_distribution=line, controls="  control")
    assert text.splitlines()[-2:] == [line, "  control"]

def _with_timers(result: table.ConfigResult, line: str) -> table.ConfigResult:
    measured = dataclasses.replace(result.workloads["w"], host_timers=line)
    return dataclasses.replace(result, workloads={"w": measured})


def test_pairs_and_the_block_show_each_server_s_model_control() -> None:
    """The decoder layer's mean per call in each server's timer line (SGLang's own code on the
    prefill path) shows how fast each process ran; pairs carry its ratio."""
    line = "KV canary host timers over 200 forwards: ModelRunner.forward 9.0us x1.00, {}"
    assert table.timer_mean_us(line.format("Qwen3DecoderLayer.forward 688.4us x18.18"),
                               "Qwen3DecoderLayer.forward") == pytest.approx(688.4)
    assert table.timer_mean_us(line.format("a 1.0us x1.00"), "Qwen3DecoderLayer.forward") is None
    off = _measured("off", tok_s=(100.0,), ttft_ms=(10.0,), step_ms=(5.0,))
    checks = _measured("all-checks", tok_s=(90.0,), ttft_ms=(11.0,), step_ms=(5.5,))
    off2 = _measured("off", run=2, tok_s=(100.0,), ttft_ms=(10.0,), step_ms=(5.0,))
    results = [_with_timers(off, line.format("LlamaDecoderLayer.forward 800.0us x2.02")),
               _with_timers(checks, line.format("LlamaDecoderLayer.forward 1000.0us x2.02")),
               off2]  # off#2 logged no timer line
    (pair,) = table.paired_comparisons(workload=_W, results=results, baselines=bench.BASELINES)
    assert pair.control_ratio == pytest.approx(1.25)
    assert pair.describe().endswith("ms/step, model control x1.250")
    controls = table.control_line(workload=_W, results=results)
    assert controls == (
        "  model control (LlamaDecoderLayer.forward: mean µs per call in each server's timer "
        "line; SGLang's own code, no canary code): off 800.0, all-checks 1000.0")
    assert table.control_line(workload=_W, results=[off, checks]) is None
    text = table.format_workload_table(workload=_W, rows=[], verdicts=[], notes=[],
                                       pairs=[pair], controls=controls)
    assert text.splitlines()[-1] == controls


def test_pairs_need_a_baseline_with_two_servers_and_an_earlier_one() -> None:
    one_off = [_measured("off", tok_s=(100.0,), ttft_ms=(10.0,), step_ms=(5.0,)),
               _measured("all-checks", tok_s=(90.0,), ttft_ms=(11.0,), step_ms=(5.5,))]
    assert table.paired_comparisons(workload=_W, results=one_off, baselines=bench.BASELINES) == []
    # the repeat of the first configuration: canary pairs with off#1, never with the later off#2
    results = [*one_off, _measured("canary", tok_s=(95.0,), ttft_ms=(10.0,), step_ms=(5.1,)),
               _measured("off", run=2, tok_s=(50.0,), ttft_ms=(10.0,), step_ms=(9.0,))]
    pairs = table.paired_comparisons(workload=_W, results=results, baselines=bench.BASELINES)
    assert [(pair.label, pair.baseline) for pair in pairs] == [
        ("all-checks#1", "off#1"), ("canary#1", "off#1")]
    assert pairs[1].tok_s_ratio.median == pytest.approx(0.95)
    # a server started before any of its baseline's servers has no pair
    early = [results[1], results[0], results[3]]
    assert table.paired_comparisons(workload=_W, results=early, baselines=bench.BASELINES) == []


def test_results_read_back_from_json_equal_what_was_written() -> None:
    result = _fake_results()[1]
    result = table.ConfigResult(
        config=result.config, run=3, status=result.status, server_note=result.server_note,
        workloads={"w": table.WorkloadResult(
            workload="w", status="measured", rounds=result.workloads["w"].rounds,
            warm_up=_timing(), warm_up_s=1.5, longest_round_s=0.5)},
        startup_s=30.0, duration_s=60.0, command=("python", "-m", "x"), log_path="/l.log",
        kv_pool_tokens=614400, max_running_requests=None, placement="scheduler on CPU 15")
    written = json.loads(json.dumps(result.to_json()))
    assert table.ConfigResult.from_json(written) == result
    del written["placement"]  # files written before placement existed
    assert table.ConfigResult.from_json(written).placement == ""


# ----------------------------------------------------------------------------- main

def test_main_writes_json_and_keeps_logs(tmp_path: pathlib.Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_HERE))
    out, logs = tmp_path / "bench.json", tmp_path / "logs"
    measure = functools.partial(bench.measure_config, server_module="fake_sglang_server")
    assert bench.main(["--models", "tiny", "--configs", "off,all-checks", "--workloads",
                       "bs1,prefill64x512", "--repeats", "1", "--out", str(out),
                       "--log-dir", str(logs), "--time-budget-s", "300"],
                      measure=measure) == 0
    printed = capsys.readouterr().out
    assert "[tiny] off: measured" in printed and "[tiny] off#2: measured" in printed
    assert "prefill64x512: 64 x 512-token prompts" in printed
    report = json.loads(out.read_text())
    results = report["models"]["tiny"]["results"]
    assert [r["label"] for r in results] == ["off", "all-checks", "off#2"]
    assert sorted(path.name for path in logs.iterdir()) == [
        "tiny-all-checks-run1.log", "tiny-off-run1.log", "tiny-off-run2.log"]
    assert all(pathlib.Path(r["log_path"]).parent == logs for r in results)
    rounds = results[1]["workloads"]["prefill64x512"]["rounds"]
    assert len(rounds) == 1 and len(rounds[0]["ttft_s"]) == 64
    assert report["models"]["tiny"]["tables"]["prefill64x512"]["rows"][1]["baseline"] == "off"
    pairs = report["models"]["tiny"]["tables"]["bs1"]["pairs"]  # off ran twice
    assert [(pair["label"], pair["baseline"]) for pair in pairs] == [("all-checks#1", "off#1")]
    assert "  pairs (each server vs the baseline server started just before it" in printed
    # the report script prints the same report again from the file alone
    assert report_script.main([str(out)]) == 0
    again = capsys.readouterr().out
    assert again.startswith(f"# {out}\n== tiny: ")
    assert again.strip().endswith(printed.strip().split("\n\n== tiny: ", 1)[1].strip())


def test_a_warm_start_runs_the_warm_ups_on_a_throwaway_server_first(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, int, int]] = []

    def measure(*, config, run, repeats, **_: object) -> table.ConfigResult:
        calls.append((config.name, run, repeats))
        return table.ConfigResult(config=config.name, run=run, status=bench.MEASURED,
                                  startup_s=1.0, duration_s=2.0,
                                  log_path=f"{config.name}-{run}.log")

    out = tmp_path / "bench.json"
    assert bench.main(["--models", "tiny", "--configs", "off,all-checks", "--workloads", "bs1",
                       "--repeats", "2", "--no-repeat-first", "--warm-start", "--out", str(out),
                       "--log-dir", str(tmp_path / "logs")], measure=measure) == 0
    assert calls == [("off", 0, 0), ("off", 1, 2), ("all-checks", 1, 2)]
    printed = capsys.readouterr().out
    assert "[tiny] warm start on a throwaway off server (not reported): measured; ready in 1 s" \
        in printed
    results = json.loads(out.read_text())["models"]["tiny"]["results"]
    assert [r["label"] for r in results] == ["off", "all-checks"]
    assert json.loads(out.read_text())["options"]["warm_start"] is True
    deadline = bench.Deadline.after(1.0)
    line = bench.warm_start(model=bench.MODELS["tiny"], model_dir=tmp_path,
                            config=bench.CONFIGS["off"], workloads=[], deadline=deadline,
                            log_dir=tmp_path, measure=measure)
    assert line.startswith("[tiny] warm start skipped: time budget (110 s needed")


def test_each_model_is_measured_and_reported_with_its_own_rounds(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, str, int]] = []

    def measure(*, model, config, run, repeats, **_: object) -> table.ConfigResult:
        calls.append((model.name, config.name, repeats))
        return table.ConfigResult(config=config.name, run=run, status=bench.MEASURED,
                                  startup_s=1.0, duration_s=2.0,
                                  log_path=f"{config.name}-{run}.log")

    out = tmp_path / "bench.json"
    assert bench.main(["--models", "tiny,8b", "--configs", "off", "--workloads", "bs1",
                       "--repeats", "tiny=5,8b=2", "--no-repeat-first", "--out", str(out),
                       "--log-dir", str(tmp_path / "logs")], measure=measure) == 0
    assert calls == [("tiny", "off", 5), ("8b", "off", 2)]
    printed = capsys.readouterr().out
    assert "median of 5 measured rounds" in printed.split("== 8b:")[0]
    assert "median of 2 measured rounds" in printed.split("== 8b:")[1]
    assert report_script.main([str(out)]) == 0
    again = capsys.readouterr().out
    assert "median of 5 measured rounds" in again.split("== 8b:")[0]
    assert "median of 2 measured rounds" in again.split("== 8b:")[1]


@pytest.mark.parametrize("argv", [[], ["--help"]])
def test_the_report_script_names_its_usage(argv: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert report_script.main(argv) == 2
    assert "usage: python benchmark/server_overhead_report.py FILE.json" in capsys.readouterr().err


def test_the_report_script_refuses_a_file_that_is_not_a_bench_report(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"options": {}}')
    assert report_script.main([str(other)]) == 2
    assert f"{other}: not a bench_server_overhead.py --out file: KeyError" in (
        capsys.readouterr().err)
    assert report_script.main([str(tmp_path / "missing.json")]) == 2


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
