"""Bad input to the CLI: exit 2 and the reason on one line, before anything is sent.

Issue 31, tried as a new user would: ``--wait -1`` was taken as "no wait", ``--holder ''``
became the default identity, a namespace with a space answered "URL can't contain control
characters", a malformed selector ended ``work`` with a progress line. Every case of
docs/cli.md's "Bad input" table is here; the kubeconfig named does not exist, so a case
that got past the checks would fail differently (exit 6, "cannot use the kubeconfig").
"""

from __future__ import annotations

import pytest

from joblease.cli import checks, main

pytestmark = pytest.mark.unit

NO_CLUSTER = ["--kubeconfig", "/nonexistent/kubeconfig"]

BAD = [
    (["claim", "job", "--wait", "-1"], "--wait: must be 0 or more seconds, not '-1'"),
    (["claim", "job", "--wait", "nan"], "--wait: must be a finite number of seconds"),
    (["claim", "job", "--wait", "soon"], "--wait: not a number of seconds: 'soon'"),
    (["claim", "job", "--holder", ""], "--holder: must not be empty"),
    (["claim", "job", "--holder", "   "], "--holder: must not be empty"),
    (["claim", "job", "--holder", "h" * 513], "--holder: at most 512 characters"),
    (["run", "--lease", "job", "--holder", "", "--", "true"], "--holder: must not be empty"),
    (["work", "-l", "a=b", "--holder", "", "--", "true"], "--holder: must not be empty"),
    (["renew", "job", "--holder", "", "--token", "1/2"], "--holder: must not be empty"),
    (["get", "job", "-n", "a b"], "-n/--namespace: not a namespace name"),
    (["get", "job", "-n", "Team"], "-n/--namespace: not a namespace name"),
    (["get", "job", "-n", "x" * 64], "-n/--namespace: not a namespace name"),
    (["get", "Job_1"], "argument name: not a JobLease name"),
    (["get", "job-"], "argument name: not a JobLease name"),
    (["describe", "a b"], "argument name: not a JobLease name"),
    (["claim", "j" * 254], "argument name: not a JobLease name"),
    (["run", "--lease", "bad name", "--", "true"], "--lease: not a JobLease name"),
    (["renew", "job", "--holder", "a", "--token", "1-2"], "--token: not a fencing token"),
    (["renew", "job", "--holder", "a", "--token", "7"], "--token: not a fencing token"),
    (["renew", "job", "--holder", "a", "--token=-1/2"], "--token: not a fencing token"),
    (["release", "job", "--holder", "a", "--epoch", "-1", "--generation", "2"],
     "--epoch: must be 0 or more, not '-1'"),
    (["release", "job", "--holder", "a", "--token", "1/2", "--claim-id", ""],
     "--claim-id: must not be empty"),
    (["complete", "job", "--holder", "a", "--token", "1/2", "--result", "r" * 1025],
     "--result: at most 1024 characters"),
    (["renew", "job", "--holder", "a", "--token", "1/2", "--timeout", "-5"],
     "--timeout: must be 0 or more seconds"),
    (["run", "--lease", "job", "--grace", "-1", "--", "true"],
     "--grace: must be 0 or more seconds"),
    (["work", "-l", "a=b", "-c", "-1", "--", "true"], "-c/--concurrency: must be at least 1"),
    (["work", "-l", "a=b", "-c", "0", "--", "true"], "-c/--concurrency: must be at least 1"),
    (["work", "-l", "a=b", "-c", "two", "--", "true"], "-c/--concurrency: not a whole number"),
    (["work", "-l", "a=b", "--grace", "-0.5", "--", "true"], "--grace: must be 0 or more"),
    (["work", "-l", "a=b", "--drain-timeout", "-1", "--", "true"],
     "--drain-timeout: must be 0 or more seconds"),
    (["work", "-l", "a=b", "--progress-every", "0", "--", "true"],
     "--progress-every: must be more than 0 seconds"),
    (["work", "-l", "a b", "--", "true"], "-l/--selector: not a label selector: 'a b'"),
    (["ls", "-l", "tier in (a,"], "not a label selector: unbalanced '('"),
    (["ls", "-l", "tier in a,b)"], "not a label selector: unbalanced ')'"),
    (["ls", "-l", "a=b,,c"], "not a label selector: '' (an empty term"),
    (["ls", "-l", "x>y"], "(the value after '>' must be a whole number, 0 or more)"),
    (["ls", "-l", "n<-2"], "(the value after '<' must be a whole number, 0 or more)"),
    (["ls", "-l", "tier in (a b)"], "is not a label value"),
    (["ls", "-l", "a-=x"], "the key 'a-' is not a label name"),
    (["ls", "-l", "Bad_Prefix/x=y"], "the key's prefix 'Bad_Prefix' is not a DNS subdomain"),
    (["ls", "-l", "a=b c"], "not a label selector: 'a=b c'"),
    (["ls", "-l", "a=" + "v" * 64], "is not a label value"),
    (["ls", "--top", "-1"], "--top: must be 0 or more"),
    (["describe", "job", "--events", "-2"], "--events: must be 0 or more"),
]


@pytest.mark.parametrize(("argv", "reason"), BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_input_is_a_usage_error_with_its_reason_on_one_line(
        argv: list[str], reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, *NO_CLUSTER])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert err.count("\n") == 1, err  # one line: the reason, not the usage before it
    assert reason in err, err
    assert err.startswith(f"joblease {argv[0]}: argument "), err


@pytest.mark.parametrize("argv", [
    ["renew", "job", "--holder", "a", "--token", "1/2", "--epoch", "1", "--generation", "2"],
    ["release", "job", "--holder", "a", "--token", "1/2", "--generation", "3"],
    ["complete", "job", "--holder", "a", "--generation", "3"],
])
def test_the_token_is_given_once_and_whole(argv: list[str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, *NO_CLUSTER]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "token" in err, err


GOOD_SELECTORS = ["", "a", "!a", "tier in ()", "a=b", "a==b", "a!=b", "a=", "tier in (a, b)",
                  "tier notin (a,b),!x", "example.com/tier=web", "n>3", "n < 2",
                  " a = b , c ", "app.kubernetes.io/name in (x)", "a_b.c-d=E_f.G-1"]


@pytest.mark.parametrize("text", GOOD_SELECTORS)
def test_every_form_kubectl_accepts_passes_unchanged(text: str) -> None:
    assert checks.selector(text) == text


def test_good_values_pass_through_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    """Sound input gets past the checks to the kubeconfig (exit 6, not 2)."""
    code = main(["work", "-l", "batch=nightly,tier in (a,b)", "-c", "3", "--grace", "0",
                 "--holder", "@identity", "-n", "team-a", "--", "true", *NO_CLUSTER])
    assert code == 6, capsys.readouterr().err
    code = main(["renew", "job.v2", "--holder", "a", "--token", "4711/7", "--timeout", "0",
                 *NO_CLUSTER])
    assert code == 6
    assert "cannot use the kubeconfig" in capsys.readouterr().err
