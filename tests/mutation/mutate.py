"""``make mutate``: mutation testing of the protocol code with mutmut, score per module.

Why a staging folder: mutmut 3 imports the mutated code from ``mutants/``, ``mutants/src``
or ``mutants/source`` and names mutants by their path, while this project's source root is
``operator/`` (see README, Layout). So the run happens in ``build/mutate/`` with
``operator/joblease`` copied to ``src/joblease`` and the pure tests copied beside it; the
work tree is never modified. Only the fast unit tests run against the mutants
(``tests/unit``, minus the schema-fuzz module, which fails on purpose until the production
fixes of issue 15 land — mutmut refuses to start on a red suite).

Usage: ``python -m tests.mutation.mutate [MODULE ...]`` where MODULE is one of
``domain``, ``transact``, ``sdk``, ``aio``, ``core``, or one client file alone,
``sdk-client`` / ``aio-client``, or the files of the holdings / the pools / the
dispatcher's proposals, ``holds`` / ``pools`` / ``inbox`` (default: the five modules).
Prints one line per module and per file: killed / total and the score, then every
survivor's name.

``--recheck TEST ...`` runs the work tree's tests (pytest paths or node ids) against each
survivor of the last run, one by one, with the staged mutants first on the path: what tests
written after the run kill, without another full run. It prints the survivors those tests
kill and those they do not.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# JOBLEASE_MUTATE_STAGE: another staging folder, so that one run's mutants stay for a
# --recheck while another module's run goes on
STAGE = Path(os.environ.get("JOBLEASE_MUTATE_STAGE", ROOT / "build" / "mutate"))
TARGETS: dict[str, str | list[str]] = {
    "domain": "src/joblease/domain/*",
    "transact": "src/joblease/core/transaction.py",
    "sdk": "src/joblease/sdk/*",
    "aio": "src/joblease/aio/*",
    "core": "src/joblease/core/*",
    # the clients alone (issue 31 item 8): their scores without the holdings and pools,
    # which are scored with their module
    "sdk-client": "src/joblease/sdk/client.py",
    "aio-client": "src/joblease/aio/client.py",
    # the holdings and the pools, files of three modules scored together against their own
    # tests (2026-12-06, after they became thin drivers over core and domain.holder)
    "holds": ["src/joblease/sdk/hold.py", "src/joblease/sdk/async_holding.py",
              "src/joblease/aio/hold.py"],
    # issue 30's proposals: the inbox and the dispatch rules, against their own tests
    "inbox": ["src/joblease/core/inbox.py", "src/joblease/domain/dispatch.py"],
    "pools": ["src/joblease/sdk/pool.py", "src/joblease/aio/pool.py",
              "src/joblease/core/pool_engine.py", "src/joblease/core/dispatcher.py",
              "src/joblease/core/claiming.py", "src/joblease/core/scope.py"],
}
# test_fuzz_schema: fails on purpose until issue 15's production fixes land (see its module
# doc). test_layout: checks the repository's layout, which the staging
# folder is not.
EXCLUDED_TESTS = ["unit/fuzz/test_fuzz_schema.py", "unit/test_layout.py"]
# test_the_demo_applies_the_packaged_crd checks which copy of the CRD the installed local
# cluster resolves to (the repository's, through the editable install), which the staging
# copy cannot be. The sentinel test leaves its sentinel processes to exit on their own;
# mutmut forks workers from the process that ran the stats and reaps with os.wait(), so such
# a late child aborts the run (KeyError in ForkRunner.wait_for_result). Neither covers
# domain, transact or sdk code. The sdk reference check lists a class's public attributes
# (``vars(cls)``), and mutmut adds a trampoline target (``xǁLeaseClientǁclaim__mutmut_1``…)
# for every mutant of every method to the class, so under ``mutate sdk`` the stats run
# failed on names no one wrote; it checks docs/sdk.md, not behaviour.
DESELECTED = [
    "tests/unit/test_crd_drift.py::test_the_demo_applies_the_packaged_crd",
    "tests/unit/test_sdk_reference.py::test_every_public_method_of_the_main_classes_is_in_the_"
    "reference",
    *(f"tests/unit/{module}::test_the_sentinel_kills_the_group_at_the_deadline_and_when_the_"
      "runner_dies" for module in ("test_safety.py", "test_safety_pure.py")),  # main renamed it
    # reads the repository's pyproject.toml (the build's version source), which the staging
    # folder replaces by its own: it checks packaging, not behaviour
    "tests/unit/test_version.py::test_the_build_reads_the_version_from_the_package_and_"
    "nowhere_else",
]
PYTEST_ARGS = ["-p", "no:cacheprovider", "-q",
               *(arg for test in DESELECTED for arg in ("--deselect", test))]
KILLED = {"killed", "timeout", "segfault"}
# Repository files the unit tests read (CRD schema and drift check, chart values, the
# operations doc's tables, the indexed-Job example). mutmut runs the tests from
# ``mutants/``, so each is also listed in ``also_copy``; without them the stats run fails
# to collect and mutmut stops.
DATA = ("crds", "charts", "docs", "examples", "localcluster/src/joblease_localcluster/data")


def stage(modules: list[str], deselect: list[str] | None = None,
          tests: list[str] | None = None) -> None:
    """Lay out ``build/mutate`` (fresh each run: stale mutants must not count).

    ``deselect``: more tests left out of this run (``--deselect``), e.g. real-time tests
    that fail on a loaded machine: mutmut refuses a red stats run, and a test that fails
    by load under a mutant counts that mutant as killed. ``tests``: run these test files
    (paths under ``tests/``) instead of all of ``tests/unit`` — a score against a named
    subset, for a machine too loaded for the whole suite's traced stats run.
    """
    args = [*PYTEST_ARGS, *(arg for test in deselect or [] for arg in ("--deselect", test))]
    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "src").mkdir(parents=True)
    shutil.copytree(ROOT / "operator" / "joblease", STAGE / "src" / "joblease",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", STAGE / "tests",
                    ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    for excluded in EXCLUDED_TESTS:
        (STAGE / "tests" / excluded).unlink()
    for data in DATA:
        shutil.copytree(ROOT / data, STAGE / data)
    pytest_opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]
    lines = ["[tool.pytest.ini_options]",
             f"testpaths = {_toml_list(['tests'])}",
             f"addopts = {pytest_opts['addopts']!r}".replace("'", '"'),
             f"markers = {_toml_list(pytest_opts['markers'])}",
             # a hung test's guard; generous because mutmut's stats run records every call
             # into mutated code (the pool view's birthday measurement took over 120 s
             # there on the shared machine)
             "timeout = 600",
             "",
             "[tool.mutmut]",
             f"source_paths = {_toml_list(['src'])}",
             f"only_mutate = {_toml_list(_globs(modules))}",
             f"pytest_add_cli_args_test_selection = {_toml_list(tests or ['tests/unit'])}",
             f"pytest_add_cli_args = {_toml_list(args)}",
             f"also_copy = {_toml_list(list(DATA))}",
             # fork (mutmut's default) forks every mutant's run from the process that ran
             # the whole suite for the stats, with whatever that left behind (threads,
             # locks, loops): the asyncio tests' shared loop thread was not in the child,
             # so they hung until the timeout, counted as kills (support.clients now starts
             # its loop per process). A fork server that only collected the tests is the
             # cleaner parent for what else a test may leave.
             'process_isolation = "forkserver"',
             ""]
    (STAGE / "pyproject.toml").write_text("\n".join(lines))


def _globs(modules: list[str]) -> list[str]:
    """The source globs of ``modules`` (a target names one glob or several files)."""
    globs: list[str] = []
    for module in modules:
        target = TARGETS[module]
        globs.extend([target] if isinstance(target, str) else target)
    return globs


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join('"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"'
                           for i in items) + "]"


def run(max_children: int) -> None:
    """Run mutmut in the staging folder (the venv's mutmut, this interpreter's venv)."""
    mutmut = Path(sys.executable).with_name("mutmut")
    env = {**os.environ, "HYPOTHESIS_PROFILE": "mutate"}
    subprocess.run([str(mutmut), "run", "--max-children", str(max_children)], cwd=STAGE,
                   env=env, check=True)


def results() -> dict[str, str]:
    """Every mutant's status, from ``mutmut results --all true``."""
    mutmut = Path(sys.executable).with_name("mutmut")
    out = subprocess.run([str(mutmut), "results", "--all", "true"], cwd=STAGE,
                         capture_output=True, text=True, check=True).stdout
    statuses: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+__mutmut_\d+): (.+)$", line)
        if m:
            statuses[m.group(1)] = m.group(2).strip()
    return statuses


def module_of(mutant: str) -> str:
    """Which of TARGETS a mutant belongs to (by its dotted name)."""
    if mutant.startswith("joblease.domain."):
        return "domain"
    if mutant.startswith("joblease.aio."):
        return "aio"
    if mutant.startswith("joblease.core.transaction."):
        return "transact"
    if mutant.startswith("joblease.core."):
        return "core"
    return "sdk"


def file_of(mutant: str) -> str:
    """The source file of a mutant (``joblease.sdk.hold.xǁHoldingǁ…`` → ``sdk/hold.py``)."""
    dotted = re.sub(r"\.x(_|ǁ).*$", "", mutant)
    return "/".join(dotted.split(".")[1:]) + ".py"


def _score_line(label: str, counts: Counter[str]) -> str:
    """One report line: killed (timeouts included) / all, the percentage, each status."""
    total = sum(counts.values())
    killed = sum(n for s, n in counts.items() if s in KILLED)
    detail = ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))
    return f"  {label} {killed:4d} / {total:4d} = {100 * killed / total:5.1f} %  ({detail})"


def report(statuses: dict[str, str]) -> int:
    """Print the score per module and the survivors; return the number of survivors."""
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: dict[str, list[str]] = defaultdict(list)
    for name, status in sorted(statuses.items()):
        module = module_of(name)
        by_module[module][status] += 1
        if status not in KILLED:
            survivors[module].append(f"{name}: {status}")
    print("\nmutation score (killed incl. timeouts / all mutants):")
    for module, counts in sorted(by_module.items()):
        print(_score_line(f"{module:9s}", counts))
    by_file: dict[str, Counter[str]] = defaultdict(Counter)
    for name, status in statuses.items():
        by_file[file_of(name)][status] += 1
    print("\nper file:")
    for path, counts in sorted(by_file.items()):
        print(_score_line(f"{path:32s}", counts))
    for module, names in sorted(survivors.items()):
        print(f"\nsurvivors in {module} ({len(names)}):")
        for name in names:
            print(f"  {name}")
    return sum(len(v) for v in survivors.values())


def recheck(statuses: dict[str, str], modules: list[str], tests: list[str],
            prefix: str = "", in_process: bool = False) -> None:
    """Run ``tests`` from the work tree against each survivor of ``modules``; print the result.

    The staged mutants (``build/mutate/mutants/src``) come first on ``PYTHONPATH``; the
    trampoline picks the mutant from ``MUTANT_UNDER_TEST``. A run that fails or outlives its
    timeout kills the mutant (``-x``: the first failure is enough).
    """
    # sdk-client's mutants are sdk's; "holds" and "pools" name files of several modules,
    # and the last run staged only theirs
    wanted = {module.split("-")[0] for module in modules}
    if wanted & {"holds", "pools"}:
        wanted = {"sdk", "aio", "core"}
    if "inbox" in wanted:  # core/inbox.py and domain/dispatch.py
        wanted |= {"core", "domain"}
    survivors = sorted(n for n, s in statuses.items()
                       if s not in KILLED and module_of(n) in wanted and n.startswith(prefix))
    env = {**os.environ, "PYTHONPATH": str(STAGE / "mutants" / "src"),
           "HYPOTHESIS_PROFILE": "mutate"}
    killed: list[str] = []
    alive: list[str] = []
    if in_process:  # one interpreter for all (tests/mutation/inprocess.py)
        names = STAGE / "recheck-names.txt"
        names.write_text("".join(f"{name}\n" for name in survivors))
        out = subprocess.run([sys.executable, "-m", "tests.mutation.inprocess", str(names),
                              *PYTEST_ARGS, "--timeout", "60", *tests], cwd=ROOT, env=env,
                             capture_output=True, text=True).stdout
        for line in out.splitlines():
            verdict, _, name = line.partition(" ")
            if name in survivors and verdict in ("killed", "survives"):
                (killed if verdict == "killed" else alive).append(name)
        survivors = []
    for count, name in enumerate(survivors, 1):
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", *PYTEST_ARGS,
                                   "--timeout", "60", *tests], cwd=ROOT,
                                  env={**env, "MUTANT_UNDER_TEST": name},
                                  capture_output=True, timeout=300)
            (alive if done.returncode == 0 else killed).append(name)
        except subprocess.TimeoutExpired:
            killed.append(name)
        print(f"recheck {count}/{len(survivors)}: killed {len(killed)}", flush=True)
    print(f"\nrecheck of {len(killed) + len(alive)} survivors of {', '.join(modules)} against "
          f"{' '.join(tests)}: {len(killed)} killed, {len(alive)} still survive")
    for name in killed:
        print(f"  killed now: {name}")
    for name in alive:
        print(f"  survives: {name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"any of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--max-children", type=int, default=2)
    parser.add_argument("--report-only", action="store_true",
                        help="print the scores of the last run without running again")
    parser.add_argument("--recheck", nargs="+", metavar="TEST",
                        help="run these work-tree tests against each survivor of the last run")
    parser.add_argument("--deselect", action="append", default=[], metavar="TEST",
                        help="leave this test (a pytest node id or file) out of the run")
    parser.add_argument("--tests", nargs="+", metavar="PATH",
                        help="run only these test files (default: tests/unit)")
    parser.add_argument("--only", default="", metavar="PREFIX",
                        help="with --recheck: only the survivors whose names start so")
    parser.add_argument("--in-process", action="store_true",
                        help="with --recheck: every mutant in one interpreter (fast; "
                             "tests/mutation/inprocess.py)")
    args = parser.parse_args(argv)
    modules = args.modules or ["domain", "transact", "sdk", "aio", "core"]
    unknown = set(modules) - set(TARGETS)
    if unknown:
        parser.error(f"unknown module(s) {sorted(unknown)}; choose from {list(TARGETS)}")
    if args.recheck:
        recheck(results(), modules, args.recheck, args.only, args.in_process)
        return 0
    if not args.report_only:
        stage(modules, args.deselect, args.tests)
        run(args.max_children)
    report(results())
    return 0


if __name__ == "__main__":
    sys.exit(main())
