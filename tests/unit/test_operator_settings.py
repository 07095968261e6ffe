"""The operator's settings: one parser, precise errors, and no state shared between runs.

Why these tests: a setting that is mistyped must stop the operator with a message naming
the flag or variable and the value, never run it on a default (a margin typo would change
when leases are taken over). And the per-run state (lease view, pod view, heartbeat) must
belong to one ``Operator``: two runs in one process must not see each other's leases.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import kopf
import pytest

from joblease.controller import handlers, main, metrics
from joblease.controller.handlers import MEMO_KEY
from joblease.controller.runtime import Operator
from joblease.controller.settings import (
    OperatorSettings,
    SettingsError,
    add_arguments,
    dispatch_pools,
)
from support.fakekube import FakeKubeApi, lease_object

pytestmark = pytest.mark.unit

HELD = {"phase": "Held", "holder": "w", "generation": 3, "epoch": 42, "attempts": 1,
        "leaseUntil": "2026-12-03T12:00:30Z", "acquiredAt": "2026-12-03T12:00:00Z",
        "renewedAt": "2026-12-03T12:00:00Z"}


def parse(argv: list[str], env: dict[str, str] | None = None) -> OperatorSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return OperatorSettings.from_args(parser.parse_args(argv), env or {})


def test_defaults_without_flags_or_environment() -> None:
    s = parse([])
    assert s == OperatorSettings()
    assert (s.margin, s.writers, s.max_server_skew, s.clock_track_ttl) == (
        timedelta(seconds=0.25), 8, 0.0, 60.0)
    assert s.clusterwide and s.namespaces == () and s.log_level == "INFO"
    assert s.liveness_endpoint == "http://127.0.0.1:8081/healthz"
    assert s.metrics_port == 8080 and s.health_file is None and s.kubeconfig is None


def test_flags_and_environment_are_read() -> None:
    s = parse(["--margin-seconds=0.5", "--writers", "8", "--max-server-skew=2.5",
               "--clock-track-ttl=0", "--log-level=warning", "--namespace=team-a",
               "--namespace=team-b", "--health-addr=", "--health-file=/tmp/alive",
               "--metrics-addr=0.0.0.0", "--metrics-port=0"], {"KUBECONFIG": "/k"})
    assert (s.margin_seconds, s.writers, s.max_server_skew, s.clock_track_ttl) == (
        0.5, 8, 2.5, 0.0)
    assert s.log_level == "WARNING" and s.namespaces == ("team-a", "team-b")
    assert not s.clusterwide and s.liveness_endpoint is None
    assert s.health_file == Path("/tmp/alive") and s.kubeconfig == "/k"
    clock = s.server_clock()
    assert (clock.max_skew, clock.track_ttl) == (2.5, 0.0)
    env = parse([], {"JOBLEASE_MARGIN_SECONDS": "1.5", "JOBLEASE_OPERATOR_WRITERS": "2",
                     "JOBLEASE_MAX_SERVER_SKEW": "3", "JOBLEASE_CLOCK_TRACK_TTL": "10"})
    assert (env.margin_seconds, env.writers, env.max_server_skew, env.clock_track_ttl) == (
        1.5, 2, 3.0, 10.0)


@pytest.mark.parametrize(("argv", "message"), [
    (["--margin-seconds=-0.1"], "--margin-seconds='-0.1': must be >= 0"),
    (["--margin-seconds=0,5"], "--margin-seconds='0,5': not a number of seconds"),
    (["--margin-seconds=nan"], "--margin-seconds='nan': must be a finite number of seconds"),
    (["--margin-seconds=inf"], "--margin-seconds='inf': must be a finite number of seconds"),
    (["--writers=0"], "--writers='0': must be between 1 and 64"),
    (["--writers=-3"], "--writers='-3': must be between 1 and 64"),
    (["--writers=2.5"], "--writers='2.5': not a whole number"),
    (["--writers=65"], "--writers='65': must be between 1 and 64"),
    (["--max-server-skew=-1"], "--max-server-skew='-1': must be >= 0"),
    (["--max-server-skew=2s"], "--max-server-skew='2s': not a number of seconds"),
    (["--clock-track-ttl=-5"], "--clock-track-ttl='-5': must be >= 0"),
    (["--metrics-port=70000"], "--metrics-port='70000': must be between 0 and 65535"),
    (["--metrics-port=http"], "--metrics-port='http': not a whole number"),
    (["--metrics-addr="], "--metrics-addr='': not an IP address or host name"),
    (["--metrics-addr=0.0.0.0:8080"], "--metrics-addr='0.0.0.0:8080': not an IP address"),
    (["--health-addr=8081"], "--health-addr='8081': must be HOST:PORT"),
    (["--health-addr=0.0.0.0:x"], "--health-addr='0.0.0.0:x': not a whole number"),
    (["--health-file="], "--health-file='': must be a file path"),
    (["--log-level=verbose"], "--log-level='verbose': must be one of DEBUG, INFO, WARNING"),
    (["--log-level=info", "--verbose"], "--log-level='info': contradicts --verbose"),
    (["--namespace=Team-A"], "--namespace='Team-A': not a namespace name"),
    (["--namespace="], "--namespace='': not a namespace name"),
    (["--namespace=a", "--namespace=a"], "--namespace='a,a': a namespace is given more"),
])
def test_each_bad_flag_is_refused_naming_the_flag_and_the_value(argv: list[str],
                                                                message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse(argv)
    assert str(caught.value).startswith(message), str(caught.value)
    assert caught.value.source == message.split("=")[0]


@pytest.mark.parametrize(("env", "message"), [
    ({"JOBLEASE_MARGIN_SECONDS": "-1"}, "JOBLEASE_MARGIN_SECONDS='-1': must be >= 0"),
    ({"JOBLEASE_MARGIN_SECONDS": "0.25s"},
     "JOBLEASE_MARGIN_SECONDS='0.25s': not a number of seconds"),
    ({"JOBLEASE_OPERATOR_WRITERS": "0"},
     "JOBLEASE_OPERATOR_WRITERS='0': must be between 1 and 64"),
    ({"JOBLEASE_OPERATOR_WRITERS": "four"},
     "JOBLEASE_OPERATOR_WRITERS='four': not a whole number"),
    ({"JOBLEASE_MAX_SERVER_SKEW": "-2"}, "JOBLEASE_MAX_SERVER_SKEW='-2': must be >= 0"),
    ({"JOBLEASE_CLOCK_TRACK_TTL": "1m"},
     "JOBLEASE_CLOCK_TRACK_TTL='1m': not a number of seconds"),
    # one typo away from a setting: it would be ignored, so it is refused
    ({"JOBLEASE_MARGIN_SECOND": "0.5"},
     "JOBLEASE_MARGIN_SECOND='0.5': not a setting (ignored if allowed); did you mean "
     "JOBLEASE_MARGIN_SECONDS?"),
    ({"JOBLEASE_MAX_SERVER_SKEW_SECONDS": "2"}, "JOBLEASE_MAX_SERVER_SKEW_SECONDS='2': not a "
     "setting (ignored if allowed); did you mean JOBLEASE_MAX_SERVER_SKEW?"),
    ({"joblease_operator_writers": "2"}, "joblease_operator_writers='2': not a setting"),
])
def test_each_bad_variable_is_refused_naming_the_variable_and_the_value(
        env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse([], env)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_flag_and_its_variable_must_agree() -> None:
    """E.g. the chart's flag and an old ``extraEnv`` entry: neither may silently win."""
    with pytest.raises(SettingsError, match=r"^--margin-seconds='0.25': disagrees with "
                       r"JOBLEASE_MARGIN_SECONDS='0.5'; set only one of them$"):
        parse(["--margin-seconds=0.25"], {"JOBLEASE_MARGIN_SECONDS": "0.5"})
    assert parse(["--writers=4"], {"JOBLEASE_OPERATOR_WRITERS": "4"}).writers == 4
    assert parse(["--margin-seconds=0.5"],
                 {"JOBLEASE_MARGIN_SECONDS": "0.50"}).margin_seconds == 0.5


def test_a_flag_given_twice_with_different_values_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    """argparse would keep the last one; a chart value plus an extra argument must not."""
    with pytest.raises(SystemExit) as exited:
        parse(["--writers=4", "--writers=8"])
    assert exited.value.code == 2
    assert "argument --writers: given twice: '4', then '8'" in capsys.readouterr().err
    assert parse(["--writers=4", "--writers=4"]).writers == 4


def test_unrelated_and_empty_variables_are_not_settings() -> None:
    env = {"JOBLEASE_STEP_SECONDS": "1", "JOBLEASE_NAME": "x", "JOBLEASE_TOKEN": "1/2",
           "JOBLEASE_MARGIN_SECONDS": "", "JOBLEASE_OPERATOR_WRITERS": "  "}
    assert parse([], env) == OperatorSettings()


def test_namespace_patterns_kopf_accepts_are_kept() -> None:
    assert parse(["--namespace=team-*", "--namespace=!kube-system"]).namespaces == (
        "team-*", "!kube-system")


def test_settings_built_directly_are_validated_too() -> None:
    with pytest.raises(SettingsError, match=r"^--writers='0': must be between 1 and 64$"):
        OperatorSettings(writers=0)
    with pytest.raises(SettingsError, match=r"^--margin-seconds='-1.0'"):
        OperatorSettings(margin_seconds=-1.0)
    with pytest.raises(SettingsError, match=r"^--log-level='debug'"):
        OperatorSettings(log_level="debug")
    with pytest.raises(SettingsError, match=r"^--namespace='NS'"):
        OperatorSettings(namespaces=("NS",))


def test_a_bad_setting_exits_2_before_anything_starts(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def must_not_run(*_: Any, **__: Any) -> None:
        raise AssertionError("started despite an invalid setting")

    monkeypatch.setattr(main, "start_http_server", must_not_run)
    monkeypatch.setattr(handlers, "run", must_not_run)
    monkeypatch.setenv("JOBLEASE_OPERATOR_WRITERS", "0")
    assert main.main([]) == 2
    assert capsys.readouterr().err == ("joblease operator: invalid setting: "
                                       "JOBLEASE_OPERATOR_WRITERS='0': must be between 1 and 64\n")


def test_main_hands_kopf_one_operator_its_own_registry_and_the_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "run", lambda **kwargs: runs.append(kwargs))
    for var in ("JOBLEASE_MARGIN_SECONDS", "JOBLEASE_OPERATOR_WRITERS",
                "JOBLEASE_MAX_SERVER_SKEW", "JOBLEASE_CLOCK_TRACK_TTL"):
        monkeypatch.delenv(var, raising=False)
    assert main.main(["--metrics-port=0", "--namespace=team-a", "--writers=2",
                      "--health-addr=127.0.0.1:9999"]) == 0
    assert main.main(["--metrics-port=0"]) == 0
    first, second = runs
    operator = first["memo"][MEMO_KEY]
    assert isinstance(operator, Operator)
    assert operator.settings.writers == 2 and operator.settings.namespaces == ("team-a",)
    assert first["namespaces"] == ("team-a",) and first["clusterwide"] is False
    assert first["liveness_endpoint"] == "http://127.0.0.1:9999/healthz"
    assert first["standalone"] is True and first["settings"].posting.enabled is False
    assert second["clusterwide"] is True
    assert second["memo"][MEMO_KEY] is not operator
    assert second["registry"] is not first["registry"]


def test_the_registry_is_write_free_and_import_registers_nothing() -> None:
    """Only watch-event and startup/cleanup handlers: no kopf annotations or finalizers."""
    registry = handlers.build_registry()
    # a login handler: without one kopf has no credentials ("Ran out of valid credentials")
    assert {h.id for h in registry._activities.get_all_handlers()} == {
        "login_via_client", "start", "stop"}
    watching = registry._watching.get_all_handlers()
    assert [h.id for h in watching] == ["on_pod_event"]  # JobLeases: the run's own feed
    assert all(inspect.iscoroutinefunction(h.fn) for h in watching)  # no thread hop
    assert not registry._changing.get_all_handlers()  # create/update/delete: would write
    assert not registry._spawning.get_all_handlers()  # timers/daemons: would write
    assert not registry._webhooks.get_all_handlers()
    default = kopf.get_default_registry()
    assert not [h for h in default._watching.get_all_handlers()
                if h.fn.__module__.startswith("joblease")]


def test_kopf_asks_the_server_for_labelled_pods_only_and_in_pages() -> None:
    """Issue 28: ``labels=`` on a handler filtered on the client, after every pod in scope
    was listed and remembered; the selector must reach the API server's query."""
    from kopf._cogs.structs.references import Resource

    settings = handlers.kopf_settings()
    pods = Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
    leases = Resource(group="joblease.dev", version="v1alpha1", plural="jobleases",
                      kind="JobLease", namespaced=True)
    assert list(settings.watching.label_selectors.collect(pods)) == ["joblease.dev/lease"]
    assert handlers.POD_LABEL_SELECTOR == "joblease.dev/lease"
    assert list(settings.watching.label_selectors.collect(leases)) == []
    assert settings.watching.chunk_size == handlers.POD_PAGE_SIZE == 500


def event(obj: dict[str, Any], type_: str = "ADDED") -> dict[str, Any]:
    return {"type": type_, "object": obj}


def test_two_operators_in_one_process_share_no_state(tmp_path: Path) -> None:
    a = Operator(OperatorSettings(health_file=tmp_path / "a"))
    b = Operator(OperatorSettings(health_file=tmp_path / "b"))
    assert a.view is not b.view and a.pods is not b.pods and a.heartbeat is not b.heartbeat
    handlers.operator_of(kopf.Memo({MEMO_KEY: a})).observe_lease(
        event(lease_object("only-a", HELD)))
    assert [o.name for o in a.view.snapshot()] == ["only-a"]
    assert b.view.snapshot() == []
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                        "labels": {"joblease.dev/lease": "only-a"}}}
    asyncio.run(handlers.on_pod_event(event(pod),  # type: ignore[arg-type]
                                      memo=kopf.Memo({MEMO_KEY: b})))
    assert b.pods.by_lease() and not a.pods.by_lease()
    a.heartbeat.beat()
    assert (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    a.observe_lease(event(lease_object("only-a", HELD), "DELETED"))
    assert a.view.snapshot() == []


class CalibratedFake(FakeKubeApi):
    """The fake API with the two calls ``Operator.start``/``stop`` add."""

    closed = False

    def calibrate(self) -> float:
        return 0.004

    def close(self) -> None:
        self.closed = True


def test_start_uses_the_settings_and_stop_releases_only_its_own_metrics() -> None:
    async def scenario() -> None:
        apis: list[CalibratedFake] = []

        def factory(_: OperatorSettings) -> Any:
            apis.append(CalibratedFake())
            return apis[-1]

        a = Operator(OperatorSettings(margin_seconds=0.5, writers=1), api_factory=factory)
        b = Operator(OperatorSettings(), api_factory=factory)
        await a.start()
        assert a.reconciler is not None and a.reconciler.margin == timedelta(seconds=0.504)
        a.observe_lease(event(lease_object("late", {**HELD,
                                                    "leaseUntil": "2026-12-03T11:00:00Z"})))
        assert metrics.OVERDUE.measure()[0] == 1  # a's view
        # its Held leases, not a scan of every lease per scrape (issue 28)
        assert metrics.OVERDUE._leases == a.view.held
        await b.start()
        assert metrics.OVERDUE.measure() == (0, 0.0)  # b's (empty) view: the latest run
        await a.stop()
        assert metrics.OVERDUE.measure() == (0, 0.0) and apis[0].closed
        assert metrics.OVERDUE._leases is not None  # b still reports
        await b.stop()
        assert metrics.OVERDUE._leases is None and apis[1].closed

    asyncio.run(scenario())


def test_the_charts_defaults_are_the_operators_defaults() -> None:
    """An install without values must run the operator exactly as documented."""
    import yaml

    values = yaml.safe_load((Path(__file__).resolve().parents[2] / "charts" /
                             "joblease-operator" / "values.yaml").read_text())["operator"]
    defaults = OperatorSettings()
    assert values == {
        "marginSeconds": defaults.margin_seconds, "writers": defaults.writers,
        "maxServerSkewSeconds": defaults.max_server_skew,
        "clockTrackTTLSeconds": defaults.clock_track_ttl,
        "watchNamespaces": list(defaults.namespaces), "logLevel": defaults.log_level,
        "dispatchPools": list(dispatch_pools(defaults.dispatch_pools))}


def test_dispatch_pools_are_namespace_slash_selector_separated_by_semicolons() -> None:
    assert dispatch_pools("batch/team=a,q=1; other/x in (1,2)") == (
        ("batch", "team=a,q=1"), ("other", "x in (1,2)"))
    assert dispatch_pools("") == ()
    for bad in ("no-slash", "Bad_NS/x=1", "batch/"):
        with pytest.raises(SettingsError, match="--dispatch-pools"):
            OperatorSettings(dispatch_pools=bad)


def test_the_api_clock_comes_from_the_settings_not_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from joblease.controller import runtime

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n")
    monkeypatch.setenv("JOBLEASE_MAX_SERVER_SKEW", "9")  # what KubeApi alone would use
    api = runtime._api_from_settings(OperatorSettings(max_server_skew=2.5, clock_track_ttl=5,
                                                      kubeconfig=str(kubeconfig)))
    try:
        assert (api.clock.max_skew, api.clock.track_ttl) == (2.5, 5.0)
        assert api.host == "http://127.0.0.1:9" and not api.clock.known
    finally:
        api.close()


# -- the dispatchers' own transport (issue 30) ---------------------------------------------


class _RecordedDispatcher:
    """Stands in for ``Dispatcher`` in ``Operator._start_dispatchers``: records its wiring."""

    made: ClassVar[list[_RecordedDispatcher]] = []

    def __init__(self, store: Any, api: Any, margin: Any, namespace: str, selector: str,
                 identity: str) -> None:
        self.store, self.api, self.margin = store, api, margin
        self.namespace, self.selector, self.identity = namespace, selector, identity
        self.closed = False
        _RecordedDispatcher.made.append(self)

    def start(self) -> _RecordedDispatcher:
        return self

    def close(self) -> None:
        self.closed = True


class DispatchFake(CalibratedFake):
    """The dispatchers' API: a worse clock estimate than the operator's."""

    def calibrate(self) -> float:
        return 0.02


def test_dispatchers_run_on_their_own_transport_with_its_clock_error_in_their_margin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Their margin must cover *their* transport's clock error, not the operator's: a
    dispatcher judges claimability on its own estimate. Stop closes that transport, once."""
    from joblease.controller import runtime

    _RecordedDispatcher.made = []
    monkeypatch.setattr(runtime, "Dispatcher", _RecordedDispatcher)
    monkeypatch.setattr(runtime, "whoami", lambda store: "system:serviceaccount:jl:operator")
    main_api, dispatch_api = CalibratedFake(), DispatchFake()

    async def scenario() -> None:
        op = Operator(OperatorSettings(margin_seconds=0.5, writers=1,
                                       dispatch_pools="batch/pool=a; other/pool=b"),
                      api_factory=lambda _: main_api,  # type: ignore[arg-type,return-value]
                      dispatch_api_factory=lambda _: dispatch_api)  # type: ignore[arg-type,return-value]
        await op.start()
        made = _RecordedDispatcher.made
        assert [(d.namespace, d.selector) for d in made] == [("batch", "pool=a"),
                                                              ("other", "pool=b")]
        assert all(d.api is dispatch_api and d.store.api is dispatch_api for d in made)
        assert all(d.margin() == timedelta(seconds=0.52) for d in made)
        assert op.reconciler is not None and op.reconciler.margin == timedelta(seconds=0.504)
        await op.stop()
        assert all(d.closed for d in made) and dispatch_api.closed and main_api.closed

    asyncio.run(scenario())


def test_an_injected_api_serves_the_dispatchers_too_and_is_closed_by_its_owner_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from joblease.controller import runtime

    _RecordedDispatcher.made = []
    monkeypatch.setattr(runtime, "Dispatcher", _RecordedDispatcher)
    monkeypatch.setattr(runtime, "whoami", lambda store: "me")
    closes: list[int] = []

    class Counted(CalibratedFake):
        def close(self) -> None:
            closes.append(1)

    api = Counted()

    async def scenario() -> None:
        op = Operator(OperatorSettings(margin_seconds=0.5, dispatch_pools="batch/pool=a"),
                      api_factory=lambda _: api)  # type: ignore[arg-type,return-value]
        await op.start()
        (made,) = _RecordedDispatcher.made
        assert made.api is api and made.margin() == timedelta(seconds=0.504)
        await op.stop()
        assert closes == [1]

    asyncio.run(scenario())


def test_the_dispatchers_transport_is_the_light_one_when_the_kubeconfig_allows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from joblease.controller.runtime import _dispatch_api_from_settings
    from joblease.kube.lite import CLIENT_ENV, LiteApiClient

    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443",
                                                   "insecure-skip-tls-verify": True}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    settings = OperatorSettings(kubeconfig=str(path), max_server_skew=3.0)
    api = _dispatch_api_from_settings(settings)
    assert isinstance(api._client, LiteApiClient)
    assert api.clock.max_skew == 3.0  # the settings' clock, not a default one
    api.close()
    monkeypatch.setenv(CLIENT_ENV, "kubernetes")  # the documented way back
    full = _dispatch_api_from_settings(settings)
    assert not isinstance(full._client, LiteApiClient)
    full.close()
