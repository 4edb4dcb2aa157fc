"""The GPU test plan of ``scripts/gpu_tests.sh`` holds every ``gpu`` test exactly once.

The GPU suite runs in two device calls, ``bash scripts/gpu_tests.sh 1`` and ``2``, each a fixed
set of shards (the script's ``GPU_PLAN``). Here, without a GPU: the ``gpu``-marked tests are
collected (``pytest --collect-only -m gpu`` in a child process), and

* every one is selected by exactly one shard of the two plans (a new test, or a renamed one,
  cannot be left out, nor run twice);
* every file or test selector of the plan selects at least one ``gpu`` test (no stale or
  misspelt entry: pytest would refuse the whole shard), and every folder selector names a
  folder (it takes whatever ``gpu`` tests the folder comes to hold);
* the tests of a module that share its servers (``shared_servers``) are in one shard;
* each plan's expected wall time (the install, its longest parallel shard, then its serial
  shards) stays within the script's ``PLAN_TARGET_S``.
"""

import json
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=40, suite="kv-canary-cpu")

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_tests.sh"
PLANS = ("1", "2")
_PLAN_BLOCK_RE = re.compile(r"^readonly GPU_PLAN='\n(?P<body>.*?)^'$", re.S | re.M)
_CONSTANT_RE = r"\b{name}=(?P<value>\d+)\b"


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    """One shard of the plan: ``shard PLAN NAME EXPECTED_S [serial]`` and its selectors."""

    plan: str
    name: str
    expected_s: int
    serial: bool
    selectors: tuple[str, ...]


def parse_plan(script: str) -> list[Shard]:
    """The shards of the script's ``GPU_PLAN`` block, in order.

    Raises:
        ValueError: no block, a selector before the first shard line, or a malformed shard line.
    """
    block = _PLAN_BLOCK_RE.search(script)
    if block is None:
        raise ValueError("no readonly GPU_PLAN='...' block in the script")
    shards: list[Shard] = []
    for line in block["body"].splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] != "shard":
            if not shards:
                raise ValueError(f"selector {line.strip()!r} before the first shard line")
            last = shards[-1]
            shards[-1] = Shard(plan=last.plan, name=last.name, expected_s=last.expected_s,
                               serial=last.serial, selectors=(*last.selectors, *words))
            continue
        if len(words) not in (4, 5) or not words[3].isdigit() or words[4:] not in ([], ["serial"]):
            raise ValueError(f"{line.strip()!r}: allowed 'shard PLAN NAME EXPECTED_S [serial]'")
        shards.append(Shard(plan=words[1], name=words[2], expected_s=int(words[3]),
                            serial=words[4:] == ["serial"], selectors=()))
    return shards


def script_constant(script: str, name: str) -> int:
    match = re.search(_CONSTANT_RE.format(name=name), script)
    assert match, f"{name}=<seconds> not found in {SCRIPT}"
    return int(match["value"])


def selects(selector: str, node_id: str) -> bool:
    """Whether pytest given ``selector`` (a directory, a file, ``FILE::TEST`` or a full node
    id) collects ``node_id``."""
    return node_id == selector or node_id.startswith(
        (f"{selector}::", f"{selector}[", f"{selector.rstrip('/')}/"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuTest:
    node_id: str
    shares_a_server: bool  # uses its module's ``shared_servers``


# Run in a child interpreter: collect the gpu tests, print each one's node id and whether it
# uses ``shared_servers`` (directly or through a module fixture) as one JSON line.
_COLLECT = """
import json, sys, pytest
class Items:
    found = []
    def pytest_collection_finish(self, session):
        self.found = [(item.nodeid, "shared_servers" in item.fixturenames)
                      for item in session.items]
items = Items()
code = pytest.main(["--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                    "test/registered"], plugins=[items])
print("GPU-TESTS " + json.dumps(items.found))
sys.exit(code)
"""


def collect_gpu_tests() -> list[GpuTest]:
    """Every ``gpu``-marked test under test/registered (fails on any collection error: an
    uncollectable module hides its tests from the plan)."""
    result = subprocess.run([sys.executable, "-c", _COLLECT], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    output = [line for line in (result.stdout + result.stderr).splitlines()
              if not line.startswith("GPU-TESTS ")]
    assert result.returncode == 0, (
        f"collecting the gpu tests failed ({result.returncode}):\n" + "\n".join(output[-60:]))
    found = [line for line in result.stdout.splitlines() if line.startswith("GPU-TESTS ")]
    assert found, result.stdout[-3000:]
    tests = [GpuTest(node_id=node_id, shares_a_server=shared)
             for node_id, shared in json.loads(found[-1].removeprefix("GPU-TESTS "))]
    assert tests, result.stdout[-3000:]
    return tests


def shards_of(node_id: str, shards: list[Shard]) -> list[str]:
    """The ``<plan>-<name>`` of every shard that selects ``node_id``."""
    return [f"{shard.plan}-{shard.name}" for shard in shards
            if any(selects(selector, node_id) for selector in shard.selectors)]


@pytest.fixture(scope="module")
def shards() -> list[Shard]:
    return parse_plan(SCRIPT.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def gpu_tests() -> list[GpuTest]:
    return collect_gpu_tests()


def test_the_plan_parses_into_named_shards_of_plans_1_and_2(shards) -> None:
    assert {shard.plan for shard in shards} == set(PLANS)
    names = [(shard.plan, shard.name) for shard in shards]
    assert len(names) == len(set(names)), names
    assert all(shard.selectors for shard in shards), [s.name for s in shards if not s.selectors]


def test_every_gpu_test_is_in_exactly_one_shard(shards, gpu_tests) -> None:
    placement = {test.node_id: shards_of(test.node_id, shards) for test in gpu_tests}
    missing = [node_id for node_id, where in placement.items() if not where]
    twice = [f"{node_id}: {where}" for node_id, where in placement.items() if len(where) > 1]
    assert not missing, ("gpu tests in no shard of scripts/gpu_tests.sh (add each to one "
                         "shard of GPU_PLAN):\n" + "\n".join(missing))
    assert not twice, "gpu tests in more than one shard:\n" + "\n".join(twice)


def test_every_selector_names_a_folder_or_selects_a_gpu_test(shards, gpu_tests) -> None:
    stale = [f"{shard.plan}-{shard.name}: {selector}" for shard in shards
             for selector in shard.selectors
             if not (REPO / selector).is_dir()
             and not any(selects(selector, test.node_id) for test in gpu_tests)]
    assert not stale, ("plan selectors that are no folder and select no gpu test:\n"
                       + "\n".join(stale))


def test_the_tests_sharing_a_module_server_are_in_one_shard(shards, gpu_tests) -> None:
    """Else each shard starts that server again (correct, but the sharing saves nothing)."""
    by_module: dict[str, set[str]] = {}
    for test in gpu_tests:
        if test.shares_a_server:
            module = test.node_id.split("::")[0]
            by_module.setdefault(module, set()).update(shards_of(test.node_id, shards))
    split = {module: sorted(where) for module, where in by_module.items() if len(where) > 1}
    assert by_module and not split, split


@pytest.mark.parametrize("plan", PLANS)
def test_each_plan_is_expected_to_end_within_its_target(shards, plan) -> None:
    script = SCRIPT.read_text(encoding="utf-8")
    target_s = script_constant(script, "PLAN_TARGET_S")
    install_s = script_constant(script, "PLAN_INSTALL_S")
    parallel = [shard.expected_s for shard in shards if shard.plan == plan and not shard.serial]
    serial = [shard.expected_s for shard in shards if shard.plan == plan and shard.serial]
    expected_s = install_s + max(parallel, default=0) + sum(serial)
    assert expected_s <= target_s, (plan, install_s, max(parallel, default=0), serial)


def test_the_plan_parser_reads_shard_lines_and_selectors() -> None:
    script = ("readonly GPU_PLAN='\n"
              "shard 1 a 10\n    x.py::t\n    y.py\n"
              "shard 2 b 20 serial\n    d\n'\n")
    assert parse_plan(script) == [
        Shard(plan="1", name="a", expected_s=10, serial=False, selectors=("x.py::t", "y.py")),
        Shard(plan="2", name="b", expected_s=20, serial=True, selectors=("d",)),
    ]
    with pytest.raises(ValueError, match="EXPECTED_S"):
        parse_plan("readonly GPU_PLAN='\nshard 1 a soon\n'\n")


def test_a_selector_selects_its_directory_file_and_function() -> None:
    node_id = "test/registered/e2e/test_x.py::test_y[cuda]"
    for selector in ("test/registered/e2e", "test/registered/e2e/", "test/registered/e2e/test_x.py",
                     "test/registered/e2e/test_x.py::test_y", node_id):
        assert selects(selector, node_id), selector
    for selector in ("test/registered/e2", "test/registered/e2e/test_x.py::test_yz",
                     "test/registered/e2e/test_x.py::test_y[cpu]"):
        assert not selects(selector, node_id), selector


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
