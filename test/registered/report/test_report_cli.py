"""``python -m sglang.srt.kv_canary.report``: the summary (by reason, check and request, first
and last step, overflows), the plot (with matplotlib; a clear error without), and exit status 2
with the line number for bad input."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from sglang.srt.kv_canary.report.__main__ import EXIT_BAD_INPUT, main
from sglang.srt.kv_canary.report.reading import ReportFormatError, read_report
from sglang.srt.kv_canary.report.schema import (
    HEADER_KEYS,
    RING_OVERFLOW_KEYS,
    SCHEMA_VERSION,
    VIOLATION_KEYS,
)
from sglang.srt.kv_canary.report.summary import Tally, format_summary, summarize
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="kv-canary-cpu")


def _header(**changes: object) -> dict:
    header = dict.fromkeys(HEADER_KEYS)
    header.update(type="header", schema=SCHEMA_VERSION, pid=11, config={"mode": "log"},
                  pool_description="p", ring_capacity=8, history_steps=4096)
    header.update(changes)
    return header


def _violation(*, step: int, rid: str | None, reasons: list[str], check: str = "post_verify",
               repeat: bool = False, **changes: object) -> dict:
    row = dict.fromkeys(VIOLATION_KEYS)
    row.update(type="violation", pid=11, time=1.0, step=step, check=check, reasons=reasons,
               reason_bits=1, req_pool_idx=3, rid=rid, slot=9, position=2, stored_token=1,
               expected_token=-1, forward_mode="DECODE", batch_size=4, repeat=repeat)
    row.update(changes)
    return row


def _overflow(dropped: int) -> dict:
    row = dict.fromkeys(RING_OVERFLOW_KEYS)
    row.update(type="ring_overflow", pid=11, time=1.0, dropped=dropped, dropped_total=dropped,
               ring_capacity=8, first_index=0, end_index=10, host_step=9)
    return row


def _write(path: pathlib.Path, objects: list[dict]) -> pathlib.Path:
    path.write_text("".join(json.dumps(obj) + "\n" for obj in objects))
    return path


@pytest.fixture()
def report(tmp_path: pathlib.Path) -> pathlib.Path:
    return _write(tmp_path / "r.jsonl", [
        _header(),
        _header(pool="draft"),
        _violation(step=5, rid="req-a", reasons=["verify_position", "verify_chain_hash"],
                   check="pre_verify"),
        _violation(step=6, rid="req-a", reasons=["verify_position", "verify_chain_hash"],
                   check="pre_verify", repeat=True),
        _violation(step=9, rid="req-b", reasons=["verify_real_kv_hash"]),
        _violation(step=12, rid=None, reasons=["verify_real_kv_hash"], check="sweep"),
        _overflow(3),
    ])


def test_the_summary_counts_by_reason_check_and_request(report: pathlib.Path) -> None:
    summary = summarize(read_report(report))
    assert (summary.rows, summary.repeats, summary.first_step, summary.last_step) == (4, 1, 5, 12)
    assert (summary.overflow_reports, summary.dropped) == (1, 3)
    assert summary.canaries == ("pid 11 (mode log)", "pid 11 pool draft (mode log)")
    assert summary.by_reason == (
        Tally(key="verify_chain_hash", rows=2, repeats=1, first_step=5, last_step=6),
        Tally(key="verify_position", rows=2, repeats=1, first_step=5, last_step=6),
        Tally(key="verify_real_kv_hash", rows=2, repeats=0, first_step=9, last_step=12),
    )
    assert [(t.key, t.rows) for t in summary.by_check] == [
        ("pre_verify", 2), ("post_verify", 1), ("sweep", 1)]
    assert [(t.key, t.rows) for t in summary.by_rid] == [
        ("req-a", 2), ("(unknown)", 1), ("req-b", 1)]


def test_the_cli_prints_the_tables(report: pathlib.Path,
                                   capsys: pytest.CaptureFixture) -> None:
    assert main([str(report)]) == 0
    out = capsys.readouterr().out
    assert "4 violation row(s) (1 repeat(s) of an earlier report), steps 5..12" in out
    assert "1 ring overflow report(s), 3 row(s) dropped" in out
    lines = out.splitlines()
    assert lines[lines.index(next(l for l in lines if l.startswith("by reason"))) + 1].split() == [
        "verify_chain_hash", "2", "1", "5", "6"]
    assert any(line.split() == ["req-b", "1", "0", "9", "9"] for line in lines)
    assert any(line.split() == ["(unknown)", "1", "0", "12", "12"] for line in lines)


def test_the_request_table_keeps_the_top_requests(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path / "many.jsonl", [_header(), *(
        _violation(step=s, rid=f"r{s}", reasons=["verify_position"]) for s in range(30))])
    text = format_summary(summarize(read_report(path)), max_requests=20)
    assert "... and 10 more request(s)" in text
    assert "more request" not in format_summary(summarize(read_report(path)), max_requests=0)


def test_a_file_without_violations(tmp_path: pathlib.Path,
                                   capsys: pytest.CaptureFixture) -> None:
    assert main([str(_write(tmp_path / "clean.jsonl", [_header()]))]) == 0
    assert "no violation rows" in capsys.readouterr().out


@pytest.mark.parametrize("lines, message", [
    ([], "holds no object"),
    (["not json"], ":2: not JSON"),
    (["[1, 2]"], ":2: a JSON list, not an object"),
    (['{"type": "gossip"}'], ":2: unknown object type 'gossip'"),
    (['{"type": "violation", "step": 1}'], ":2: a violation object without pid, time"),
    ([json.dumps(_violation(step="5", rid="a", reasons=[]))], ":2: step='5' has the wrong type"),
    ([json.dumps(_violation(step=5, rid="a", reasons=[1]))], ":2: reasons=[1] are not all"),
    ([json.dumps(_violation(step=5, rid="a", reasons=[], repeat=1))],
     ":2: repeat=1 has the wrong type"),
    (["", json.dumps(_overflow(1)), "{"], ":4: not JSON"),  # blank lines are skipped
])
def test_bad_lines_are_refused_with_their_line_number(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture, lines: list[str], message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    head = [json.dumps(_header())] if lines else []
    path.write_text("\n".join(head + lines) + ("\n" if lines else ""))
    with pytest.raises(ReportFormatError, match=re.escape(message)):
        read_report(path)
    assert main([str(path)]) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_the_first_object_must_be_a_header(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path / "h.jsonl", [_violation(step=1, rid="a", reasons=[])])
    with pytest.raises(ReportFormatError, match=r"h.jsonl:1: the first object is a 'violation'"):
        read_report(path)


def test_a_newer_schema_is_refused(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path / "new.jsonl", [_header(schema=SCHEMA_VERSION + 1)])
    with pytest.raises(ReportFormatError, match=f"schema {SCHEMA_VERSION + 1}"):
        read_report(path)


def test_a_missing_file_exits_2(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture) -> None:
    assert main([str(tmp_path / "nope.jsonl")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "cannot read" in err and "No such file or directory" in err


def test_plot_without_matplotlib_says_to_install_it(
    report: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main([str(report), "--plot", str(tmp_path / "out.png")]) == EXIT_BAD_INPUT
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "out.png").exists()


def test_plot_writes_a_png(report: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "out.png"
    assert main([str(report), "--plot", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_the_module_runs_as_a_program(report: pathlib.Path) -> None:
    result = subprocess.run([sys.executable, "-m", "sglang.srt.kv_canary.report", str(report)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "by request (rid)" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "sglang.srt.kv_canary.report",
                          str(report) + ".missing"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == EXIT_BAD_INPUT and "cannot read" in bad.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
