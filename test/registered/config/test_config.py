"""The configuration layer: parsing, validation, messages."""

import os
import pathlib
import sys

import pytest

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.srt.kv_canary.config import (
    KNOBS,
    KNOWN_NAMES,
    CanaryConfig,
    CanaryConfigError,
    CanaryMode,
    RealDataMode,
    flags_from_argv,
    markdown_table,
    parse_config,
)

register_cpu_ci(est_time=5, suite="kv-canary-cpu")


def test_empty_environment_gives_defaults_and_nothing_enabled() -> None:
    config = parse_config({})
    assert config == CanaryConfig()
    assert not config.anything_enabled
    assert config.ring_capacity == 1024
    assert config.stats_print_every_n_steps == 100
    assert config.perturb.warmup_steps == 50


def test_unrelated_variables_are_ignored() -> None:
    assert parse_config({"PATH": "/bin", "SGLANG_OTHER": "1"}) == CanaryConfig()


@pytest.mark.parametrize("raw,mode", [("log", CanaryMode.LOG), ("RAISE", CanaryMode.RAISE),
                                      (" none ", CanaryMode.NONE)])
def test_modes(raw: str, mode: CanaryMode) -> None:
    assert parse_config({"SGLANG_KV_CANARY_MODE": raw}).mode is mode


def test_bad_mode_names_variable_value_and_allowed() -> None:
    with pytest.raises(CanaryConfigError) as info:
        parse_config({"SGLANG_KV_CANARY_MODE": "loud"})
    message = str(info.value)
    assert "SGLANG_KV_CANARY_MODE" in message and "'loud'" in message
    assert "none, log, abort, raise" in message


def test_unknown_name_is_rejected_with_suggestion() -> None:
    with pytest.raises(CanaryConfigError) as info:
        parse_config({"SGLANG_KV_CANARY_MDOE": "log"})
    assert "SGLANG_KV_CANARY_MDOE" in str(info.value)
    assert "did you mean SGLANG_KV_CANARY_MODE?" in str(info.value)


@pytest.mark.parametrize(
    "name,raw",
    [
        ("SGLANG_KV_CANARY_RING_CAPACITY", "0"),
        ("SGLANG_KV_CANARY_RING_CAPACITY", "many"),
        ("SGLANG_KV_CANARY_SWEEP_INTERVAL", "-1"),
        ("SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS", "1.5"),
        ("SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS", "-3"),
        ("SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB", "1.5"),
        ("SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB", "nan"),
        ("SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB", "-0.1"),
        ("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", "maybe"),
        ("SGLANG_KV_CANARY_REAL_DATA", "half"),
        ("SGLANG_KV_CANARY_REAL_DATA_STRIDE", "0"),
        ("SGLANG_KV_CANARY_REAL_DATA_STRIDE", "1048577"),
    ],
)
def test_bad_values_name_the_variable_and_value(name: str, raw: str) -> None:
    environ = {"SGLANG_KV_CANARY_MODE": "log", name: raw}
    with pytest.raises(CanaryConfigError) as info:
        parse_config(environ)
    assert name in str(info.value) and repr(raw) in str(info.value)


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), ("ON", True), ("yes", True),
                                       ("0", False), ("false", False), ("off", False), ("", False)])
def test_booleans(raw: str, value: bool) -> None:
    config = parse_config({"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": raw})
    assert config.enable_token_oracle is value
    assert config.anything_enabled is value


def test_full_configuration() -> None:
    config = parse_config({
        "SGLANG_KV_CANARY_MODE": "raise",
        "SGLANG_KV_CANARY_REAL_DATA": "partial",
        "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1",
        "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1",
        "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": "1",
        "SGLANG_KV_CANARY_PERTURB_REAL_KV_USED_PROB": "0.5",
        "SGLANG_KV_CANARY_PERTURB_SEED": "7",
    })
    assert config.mode is CanaryMode.RAISE and config.real_data is RealDataMode.PARTIAL
    assert config.perturb.seed == 7
    assert config.perturb.enabled_probabilities() == {"real_kv_used": 0.5}
    line = config.describe()
    assert "mode=raise" in line and "real_data=partial" in line
    assert "real_kv_used:0.5" in line and "seed=7" in line


@pytest.mark.parametrize(
    "environ,fragment",
    [
        ({"SGLANG_KV_CANARY_REAL_DATA": "all"},
         "SGLANG_KV_CANARY_REAL_DATA='all' would have no effect"),
        ({"SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "1"}, "MODE=none"),
        ({"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": "1"},
         "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1"),
        ({"SGLANG_KV_CANARY_PERTURB_NEXT_TOKEN_SWAP_PROB": "1"},
         "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=1"),
        ({"SGLANG_KV_CANARY_SWEEP_INTERVAL": "3"},
         "SGLANG_KV_CANARY_SWEEP_INTERVAL='3' would have no effect"),
        # Only the sweep sees cached slots no request uses.
        ({"SGLANG_KV_CANARY_MODE": "log",
          "SGLANG_KV_CANARY_PERTURB_REAL_KV_UNUSED_CACHE_PROB": "1"},
         "SGLANG_KV_CANARY_PERTURB_REAL_KV_UNUSED_CACHE_PROB='1' would have no effect"),
        ({"SGLANG_KV_CANARY_REINJECT_PADDED_ROW_BUG": "1"},
         "SGLANG_KV_CANARY_REINJECT_PADDED_ROW_BUG='1' would have no effect"),
        ({"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA_STRIDE": "4"},
         "SGLANG_KV_CANARY_REAL_DATA=none (no bytes are fingerprinted)"),
    ],
)
def test_settings_that_would_do_nothing_are_rejected(environ: dict, fragment: str) -> None:
    with pytest.raises(CanaryConfigError) as info:
        parse_config(environ)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "environ,name,raw,reason",
    [
        ({}, "SGLANG_KV_CANARY_RING_CAPACITY", "2048", "MODE=none"),
        ({}, "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS", "10", "MODE=none"),
        ({}, "SGLANG_KV_CANARY_HEALTH_CHECK_EVERY_N_STEPS", "10", "MODE=none"),
        ({"SGLANG_KV_CANARY_MODE": "log"}, "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS", "5",
         "no perturbation is enabled"),
        ({"SGLANG_KV_CANARY_MODE": "log"}, "SGLANG_KV_CANARY_PERTURB_SEED", "7",
         "no perturbation is enabled"),
        # No off value: even the default is refused where it cannot matter.
        ({}, "SGLANG_KV_CANARY_RING_CAPACITY", "1024", "MODE=none"),
        ({}, "SGLANG_KV_CANARY_PERTURB_SEED", "0", "no perturbation is enabled"),
    ],
)
def test_no_effect_settings_are_refused_naming_variable_and_value(
    environ: dict, name: str, raw: str, reason: str
) -> None:
    with pytest.raises(CanaryConfigError) as info:
        parse_config({**environ, name: raw})
    message = str(info.value)
    assert f"{name}={raw!r} would have no effect" in message
    assert reason in message


@pytest.mark.parametrize(
    "name,raw",
    [
        ("SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS", "0"),
        ("SGLANG_KV_CANARY_REAL_DATA", "none"),
        ("SGLANG_KV_CANARY_REAL_DATA", "NONE"),
        ("SGLANG_KV_CANARY_SWEEP_INTERVAL", "0"),
        ("SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT", "off"),
        ("SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB", "0.0"),
    ],
)
def test_off_values_are_accepted_anywhere(name: str, raw: str) -> None:
    assert not parse_config({name: raw}).anything_enabled  # MODE unset: accepted, nothing on


def test_perturbation_knobs_take_effect_with_a_perturbation() -> None:
    config = parse_config({
        "SGLANG_KV_CANARY_MODE": "log",
        "SGLANG_KV_CANARY_PERTURB_REQ_TO_TOKEN_PROB": "0.5",
        "SGLANG_KV_CANARY_PERTURB_WARMUP_STEPS": "5",
        "SGLANG_KV_CANARY_PERTURB_SEED": "7",
    })
    assert (config.perturb.warmup_steps, config.perturb.seed) == (5, 7)


def test_the_sweep_and_its_perturbation_are_accepted_with_the_canary() -> None:
    config = parse_config({"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_SWEEP_INTERVAL": "4",
                           "SGLANG_KV_CANARY_PERTURB_REAL_KV_UNUSED_CACHE_PROB": "0.5"})
    assert config.sweep_interval == 4 and config.perturb.real_kv_unused_cache_prob == 0.5


def test_a_real_data_stride_is_accepted_with_real_data_and_shown_at_start_up() -> None:
    config = parse_config({"SGLANG_KV_CANARY_MODE": "log", "SGLANG_KV_CANARY_REAL_DATA": "partial",
                           "SGLANG_KV_CANARY_REAL_DATA_STRIDE": "4"})
    assert config.real_data_stride == 4 and "real_data_stride=4" in config.describe()
    assert "real_data_stride" not in parse_config({"SGLANG_KV_CANARY_MODE": "log"}).describe()


def test_oracle_alone_is_allowed_without_canary() -> None:
    config = parse_config({"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1",
                           "SGLANG_KV_CANARY_PERTURB_NEXT_TOKEN_SWAP_PROB": "1"})
    assert config.enable_token_oracle and not config.canary_enabled and config.anything_enabled


def test_config_is_frozen() -> None:
    config = parse_config({})
    with pytest.raises(AttributeError):
        config.mode = CanaryMode.LOG  # type: ignore[misc]


def test_only_the_config_module_reads_the_environment() -> None:
    """Runtime code gets settings from the config layer. The one exception is ``tools/`` (test
    and demo helpers that build a child process's environment for launch_server)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[3] / "python"
    config_module = root / "sglang/srt/kv_canary/config.py"
    tools_package = root / "sglang/srt/kv_canary/tools"
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path != config_module and tools_package not in path.parents
        and ("os.environ" in path.read_text() or "getenv" in path.read_text())
    ]
    assert offenders == []


def _readme() -> str:
    import pathlib

    return (pathlib.Path(__file__).resolve().parents[3] / "README.md").read_text()


def test_readme_lists_every_variable() -> None:
    readme = _readme()
    assert [name for name in sorted(KNOWN_NAMES) if name not in readme] == []


def test_readme_table_is_the_generated_one() -> None:
    """Names, allowed values, defaults and meanings in the README come from ``KNOBS``."""
    lines = _readme().splitlines()
    header = markdown_table().splitlines()[0]
    assert lines.count(header) == 1
    start = lines.index(header)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    assert "\n".join(lines[start:end]) == markdown_table()


def test_generated_table_has_one_row_per_knob() -> None:
    rows = markdown_table().splitlines()[2:]
    assert len(rows) == len(KNOBS)
    for row, knob in zip(rows, KNOBS):
        default = f"`{knob.default}`" if knob.default else "unset"  # (an empty default)
        assert row.startswith(f"| `{knob.name}` | {knob.allowed} | {default} | ")
        assert knob.meaning in row



# ----------------------------------------------------------------------------- launch flags


def test_launch_flags_stand_for_their_variables() -> None:
    config = parse_config({}, argv=["--model-path", "m", "--kv-canary", "raise",
                                    "--kv-canary-real-data=partial",
                                    "--kv-canary-sweep-interval", "8"])
    assert (config.mode, config.real_data, config.sweep_interval) == (
        CanaryMode.RAISE, RealDataMode.PARTIAL, 8)
    assert config.launch_flags
    assert not parse_config({}, argv=["--model-path", "m"]).launch_flags
    assert parse_config({}, argv=["--help"]).launch_flags  # --help lists them
    assert not parse_config({}, argv=["--help"]).anything_enabled


def test_a_flag_and_its_variable_must_agree() -> None:
    same = parse_config({"SGLANG_KV_CANARY_MODE": "log"}, argv=["--kv-canary", "LOG"])
    assert same.mode is CanaryMode.LOG
    with pytest.raises(CanaryConfigError) as error:
        parse_config({"SGLANG_KV_CANARY_MODE": "log"}, argv=["--kv-canary", "raise"])
    assert "--kv-canary raise" in str(error.value)
    assert "SGLANG_KV_CANARY_MODE='log'" in str(error.value)


@pytest.mark.parametrize("argv, message", [
    (["--kv-canary-realdata", "all"], "unknown flag --kv-canary-realdata; did you mean "
                                      "--kv-canary-real-data?"),
    (["--kv-canary-r", "all"], "unknown flag --kv-canary-r"),  # abbreviations are refused
    (["--kv-canary"], "--kv-canary needs a value"),
    (["--kv-canary", "--port", "1"], "--kv-canary needs a value"),
    (["--kv-canary", "log", "--kv-canary=raise"], "--kv-canary is given twice"),
    (["--kv-canary", "loud"], "--kv-canary='loud' is invalid; allowed: none, log, abort, raise"),
    (["--kv-canary-sweep-interval", "-1"], "--kv-canary-sweep-interval='-1' is invalid"),
])
def test_bad_flags_are_refused_with_what_is_allowed(argv: list[str], message: str) -> None:
    with pytest.raises(CanaryConfigError, match=message.replace("?", r"\?")):
        parse_config({}, argv=argv)


def test_a_flag_set_where_it_has_no_effect_is_refused_like_its_variable() -> None:
    with pytest.raises(CanaryConfigError, match="would have no effect"):
        parse_config({}, argv=["--kv-canary-real-data", "partial"])  # the canary is off


# ----------------------------------------------------------------------------- report path

_REPORT_PATH = "SGLANG_KV_CANARY_REPORT_PATH"


def test_report_path_is_off_by_default_and_made_absolute(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert parse_config({"SGLANG_KV_CANARY_MODE": "log"}).report_path is None
    monkeypatch.chdir(tmp_path)
    config = parse_config({"SGLANG_KV_CANARY_MODE": "log", _REPORT_PATH: " report.jsonl "})
    assert config.report_path == str(tmp_path / "report.jsonl")
    assert f"report_path={tmp_path / 'report.jsonl'}" in config.describe()
    assert not (tmp_path / "report.jsonl").exists()  # checked, not created
    existing = tmp_path / "old.jsonl"
    existing.write_text("{}\n")
    assert parse_config({"SGLANG_KV_CANARY_MODE": "raise",
                         _REPORT_PATH: str(existing)}).report_path == str(existing)


def test_an_empty_report_path_means_no_file_and_is_accepted_anywhere() -> None:
    assert parse_config({_REPORT_PATH: ""}) == CanaryConfig()
    assert parse_config({_REPORT_PATH: "  "}) == CanaryConfig()
    assert parse_config({"SGLANG_KV_CANARY_MODE": "log", _REPORT_PATH: ""}).report_path is None


def test_a_report_path_with_the_canary_off_is_refused(tmp_path: pathlib.Path) -> None:
    raw = str(tmp_path / "r.jsonl")
    with pytest.raises(CanaryConfigError) as info:
        parse_config({_REPORT_PATH: raw})
    assert f"{_REPORT_PATH}={raw!r} would have no effect" in str(info.value)
    assert "MODE=none" in str(info.value)
    with pytest.raises(CanaryConfigError, match="would have no effect"):  # the oracle alone
        parse_config({"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1", _REPORT_PATH: raw})


@pytest.mark.parametrize("relative, reason", [
    ("missing/r.jsonl", "directory {tmp}/missing does not exist"),
    (".", "{tmp} is a directory"),
    ("a_file/r.jsonl", "directory {tmp}/a_file does not exist"),
])
def test_an_unwritable_report_path_names_variable_value_and_reason(
    tmp_path: pathlib.Path, relative: str, reason: str
) -> None:
    (tmp_path / "a_file").write_text("")
    raw = str(tmp_path / relative)
    with pytest.raises(CanaryConfigError) as info:
        parse_config({"SGLANG_KV_CANARY_MODE": "log", _REPORT_PATH: raw})
    message = str(info.value)
    assert f"{_REPORT_PATH}={raw!r} is invalid: " in message
    assert reason.format(tmp=tmp_path) in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_report_path_without_permission_is_refused(tmp_path: pathlib.Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    read_only = tmp_path / "read_only.jsonl"
    read_only.write_text("")
    read_only.chmod(0o400)
    for raw, reason in ((str(locked / "r.jsonl"), "permission denied"),
                        (str(read_only), "is not writable")):
        with pytest.raises(CanaryConfigError, match=reason):
            parse_config({"SGLANG_KV_CANARY_MODE": "log", _REPORT_PATH: raw})


def test_the_report_path_flag_stands_for_its_variable(tmp_path: pathlib.Path) -> None:
    raw = str(tmp_path / "r.jsonl")
    config = parse_config({}, argv=["--kv-canary", "log", "--kv-canary-report-path", raw])
    assert config.report_path == raw and config.launch_flags
    assert parse_config({_REPORT_PATH: raw},
                        argv=["--kv-canary=log", f"--kv-canary-report-path={raw}"]).report_path
    with pytest.raises(CanaryConfigError, match="disagree"):
        parse_config({_REPORT_PATH: raw}, argv=["--kv-canary", "log",
                                                "--kv-canary-report-path", raw + ".other"])
    with pytest.raises(CanaryConfigError, match="--kv-canary-report-path=.* is invalid"):
        parse_config({}, argv=["--kv-canary", "log",
                               "--kv-canary-report-path", str(tmp_path / "no" / "r")])


def test_flags_from_argv_reads_both_forms() -> None:
    assert flags_from_argv(["--kv-canary=log", "--kv-canary-sweep-interval", "4"]) == {
        "SGLANG_KV_CANARY_MODE": ("--kv-canary", "log"),
        "SGLANG_KV_CANARY_SWEEP_INTERVAL": ("--kv-canary-sweep-interval", "4"),
    }

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
