"""`import joblease.cli` stays cheap: no operator framework, no metrics, no controller.

Startup time is most of a CLI call (issue 18, item 5). Each check runs in a fresh
interpreter, because this test process has long since imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("kopf", "prometheus_client", "joblease.controller", "aiohttp")


def _loaded_after(code: str) -> set[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60)
    return set(json.loads(out.stdout.splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_importing_the_cli_loads_no_operator_code() -> None:
    loaded = _loaded_after("import joblease.cli")
    assert "joblease.cli" in loaded
    assert _heavy(loaded) == []


@pytest.mark.parametrize("argv", [["--help"], ["get", "--help"], ["ls", "--help"],
                                  ["completion", "bash"]])
def test_parsing_and_help_load_no_operator_code(argv: list[str]) -> None:
    code = ("import contextlib, io\nfrom joblease import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            f"    cli.main({argv!r})")
    assert _heavy(_loaded_after(code)) == []


def test_operator_verb_is_handed_to_the_controller_parser() -> None:
    # the one verb that needs kopf imports it itself, and its --help is the controller's
    out = subprocess.run([sys.executable, "-m", "joblease.cli", "operator", "--help"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert "--metrics-port" in out.stdout


def test_the_blocking_client_loads_no_asyncio() -> None:
    """The one-shot verbs' path (the sync client and its protocol core) stays off asyncio:
    the core's asyncio driver lives in ``joblease.core.asteps`` (the cluster test
    ``test_light_and_full_transports_agree…`` caught ``core/steps.py`` importing it)."""
    loaded = _loaded_after("import joblease.sdk.client, joblease.sdk.pool, joblease.cli")
    assert not [m for m in loaded if m == "asyncio" or m.startswith("asyncio.")]
    assert "joblease.core.asteps" not in loaded


def test_the_thread_holding_and_a_pods_token_reader_load_no_asyncio_and_no_sdk() -> None:
    """Issue 31: ``joblease.sdk.hold`` drives the holding engine with threads only (the
    deprecated asyncio flavour moved out), and ``joblease.pod.downward`` (and its old name,
    ``joblease.downward``), which runs in a delegated pod, needs neither the SDK nor asyncio."""
    loaded = _loaded_after("import joblease.sdk.hold")
    assert not [m for m in loaded if m == "asyncio" or m.startswith("asyncio.")]
    loaded = _loaded_after("import joblease.downward")
    assert not [m for m in loaded if m == "asyncio" or m.startswith("asyncio.")]
    assert not [m for m in loaded if m.startswith(("joblease.sdk", "joblease.core"))]
