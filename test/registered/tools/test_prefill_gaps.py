"""``benchmark/prefill_gaps.py``: the gaps come from SGLang's prefill lines (only one-sequence,
uncached prefills of the asked size), from folders and tarballs alike; slow gaps are counted
against the smallest p10 of the same source and model; bad options name the option, the value
and what is allowed."""

import pathlib
import sys
import tarfile

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="kv-canary-cpu")

_BENCH_DIR = pathlib.Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(_BENCH_DIR))

import prefill_gaps  # noqa: E402


def _prefill(*, new: int, cached: int = 0, seqs: int = 1, gap_ms: float) -> str:
    """One SGLang 0.5.12 prefill line whose throughput says ``gap_ms`` since the last one."""
    return (
        f"[2026-11-29 09:20:28] Prefill batch, #new-seq: {seqs}, #new-token: {new}, "
        f"#cached-token: {cached}, token usage: 0.00, #running-req: 0, #queue-req: 0, "
        f"#pending-token: 0, cuda graph: False, input throughput (token/s): "
        f"{new * 1000.0 / gap_ms:.2f}"
    )


def _write_logs(folder: pathlib.Path) -> None:
    fast = [_prefill(new=128, gap_ms=30.0 + i % 3) for i in range(10)]
    # slow for four requests, then fast; one pause over the limit; lines of other prefills
    changing = ([_prefill(new=128, gap_ms=50.0)] * 4 + [_prefill(new=128, gap_ms=31.0)] * 6
                + [_prefill(new=128, gap_ms=900.0), _prefill(new=128, cached=64, gap_ms=5.0),
                   _prefill(new=128, seqs=2, gap_ms=5.0), _prefill(new=18, gap_ms=5.0),
                   "INFO: 127.0.0.1 - POST /generate 200 OK"])
    (folder / "8b-off-run1.log").write_text("\n".join(fast) + "\n")
    (folder / "8b-all-checks-run1.log").write_text("\n".join(changing) + "\n")
    (folder / "tiny-off-run1.log").write_text(_prefill(new=128, gap_ms=10.0) + "\n")


def test_gaps_and_slow_counts_from_a_folder(tmp_path: pathlib.Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _write_logs(tmp_path)
    assert prefill_gaps.main([str(tmp_path), "--model", "8b"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # the tiny log is left out
    changing = next(line for line in lines if "8b-all-checks-run1.log" in line)
    fast = next(line for line in lines if "8b-off-run1.log" in line)
    # ten kept gaps (the 900 ms pause left out); four over 1.3 x 30.0 ms, the smallest p10
    assert "10 gaps (1 over the limit left out)" in changing
    assert changing.endswith("4 over 39.0 ms")
    assert "p10 31.0 / p50 31.0 / p90 50.0 ms" in changing
    assert "10 gaps (0 over the limit left out)" in fast and fast.endswith("0 over 39.0 ms")


def test_the_summary_counts_slow_logs_per_configuration(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_logs(tmp_path)
    (tmp_path / "8b-all-checks-run2.log").write_text(
        "\n".join([_prefill(new=128, gap_ms=45.0)] * 10) + "\n"
    )
    assert prefill_gaps.main([str(tmp_path), "--first", "10"]) == 0
    out = capsys.readouterr().out
    summary = out.split("by configuration (logs with at least 5 gaps, beside another log of "
                        "their model in their source):\n", 1)[1].splitlines()
    # run2 is slow at its median; run1 has 4 of 10 gaps slow; the tiny log is alone: left out
    assert summary == [
        "  8b all-checks: 2 logs, slow at the median in 1, a quarter or more of the gaps slow in 2",
        "  8b off: 1 logs, slow at the median in 0, a quarter or more of the gaps slow in 0",
    ]


def test_a_tarball_reads_as_its_folder(tmp_path: pathlib.Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    _write_logs(logs)
    archive = tmp_path / "run-logs.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(logs, arcname="logs")
    assert prefill_gaps.main([str(logs)]) == 0
    from_folder = [line.split("  ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert prefill_gaps.main([str(archive)]) == 0
    from_tarball = [line.split("  ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert from_tarball == from_folder and len(from_folder) == 3


def test_the_first_gaps_only(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_logs(tmp_path)
    assert prefill_gaps.main([str(tmp_path), "--model", "8b", "--first", "4"]) == 0
    changing = next(line for line in capsys.readouterr().out.splitlines()
                    if "all-checks" in line)
    assert "4 gaps (0 over the limit left out), p10 50.0 / p50 50.0" in changing


@pytest.mark.parametrize("option", ["--new-tokens", "--first", "--max-gap-ms", "--slow-factor"])
def test_a_bad_option_is_refused(option: str, tmp_path: pathlib.Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        prefill_gaps.main([str(tmp_path), option, "0"])
    assert f"{option}=0 is invalid; allowed: a" in capsys.readouterr().err


def test_missing_sources_and_no_prefills_are_errors(tmp_path: pathlib.Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert prefill_gaps.main([str(tmp_path / "absent")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "8b-off-run1.log").write_text("no prefill here\n")
    assert prefill_gaps.main([str(tmp_path)]) == 1
    assert "no log with prefill lines of 128 new tokens" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
