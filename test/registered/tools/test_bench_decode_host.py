"""``benchmark/bench_decode_host.py`` runs on a CPU: both per-step hooks are timed over steady
decode steps that take the unit-step pack (the path a server's decode steps take), the
``--steady-floor`` measurement packs and uploads nothing on steady steps and is undone after, and
bad arguments are refused with the flag, the value and what is allowed."""

import pathlib
import sys

import pytest

from sglang.srt.kv_canary.runner.canary_runner import CanaryRunner
from sglang.srt.kv_canary.runner.request_rows import RequestRows
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="kv-canary-cpu")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "benchmark"))

import bench_decode_host  # noqa: E402


def test_a_small_run_times_both_hooks_over_unit_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    unit_steps = 0
    original = RequestRows._pack_unit_step

    def counting(self: RequestRows, **kwargs: object) -> object:
        nonlocal unit_steps
        unit_steps += 1
        return original(self, **kwargs)

    monkeypatch.setattr(RequestRows, "_pack_unit_step", counting)
    init_new, run_forward = bench_decode_host.measure(requests=3, steps=5)
    assert init_new > 0 and run_forward > 0
    assert unit_steps >= 5  # every measured step (and the warm-up ones) took the unit-step pack


def test_the_steady_floor_packs_and_uploads_nothing_and_is_undone(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls = {"pack": 0, "upload": 0}
    pack, upload = RequestRows._pack_unit_step, CanaryRunner._apply_row_updates

    def counting_pack(self: RequestRows, **kwargs: object) -> object:
        calls["pack"] += 1
        return pack(self, **kwargs)

    def counting_upload(self: CanaryRunner, updates: object) -> None:
        calls["upload"] += 1
        upload(self, updates)

    monkeypatch.setattr(RequestRows, "_pack_unit_step", counting_pack)
    monkeypatch.setattr(CanaryRunner, "_apply_row_updates", counting_upload)
    prepare = RequestRows.prepare
    bench_decode_host.measure(requests=3, steps=20, steady_floor=True)
    assert RequestRows.prepare is prepare
    # the ten warm-up steps pack and upload; of the 20 measured steps only the first does
    assert calls["pack"] <= 12 and calls["upload"] <= 13
    assert bench_decode_host.main(["--steps", "3", "--batches", "2", "--rounds", "2",
                                   "--steady-floor"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert "floor / canary (quartiles)" in header and "over 2 round(s)" in header
    assert len(row.split()) == 7  # batch, 2 hooks, canary, floor, ratio, (quartiles)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps=0 is invalid; allowed: an integer >= 1"),
        (["--rounds", "0"], "--rounds=0 is invalid; allowed: an integer >= 1"),
        (["--batches", "1,x"], "--batches='1,x' is invalid; allowed: integers >= 1"),
        (["--batches", "0"], "--batches='0' is invalid; allowed: integers >= 1"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        bench_decode_host.main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
