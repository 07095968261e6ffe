"""The chart as helm sees it: lint, schema, and what the templates render."""

from __future__ import annotations

import json
from typing import Any

import yaml
from kwok_support import CHART, helm


def render(*sets: str) -> dict[str, dict[str, Any]]:
    out = helm(None, "template", "jl", str(CHART), "-n", "joblease-system",
               *[arg for s in sets for arg in ("--set", s)])
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs}


def test_helm_lint_passes() -> None:
    out = helm(None, "lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in out.stdout


def test_default_render_has_every_part() -> None:
    kinds = sorted(render())
    assert kinds == sorted([
        "ClusterRole/jl-joblease-operator", "ClusterRole/jl-joblease-operator-worker",
        "ClusterRoleBinding/jl-joblease-operator", "Deployment/jl-joblease-operator",
        "Service/jl-joblease-operator-metrics", "ServiceAccount/jl-joblease-operator",
        "ValidatingAdmissionPolicy/jl-joblease-operator-holder-only",
        "ValidatingAdmissionPolicyBinding/jl-joblease-operator-holder-only",
        "ValidatingAdmissionPolicy/jl-joblease-operator-operator-pods",
        "ValidatingAdmissionPolicyBinding/jl-joblease-operator-operator-pods",
        "ValidatingAdmissionPolicy/jl-joblease-operator-dispatch",
        "ValidatingAdmissionPolicyBinding/jl-joblease-operator-dispatch",
        "ValidatingAdmissionPolicy/jl-joblease-operator-presence",
        "ValidatingAdmissionPolicyBinding/jl-joblease-operator-presence"])


def test_unknown_values_are_refused_by_the_schema() -> None:
    out = helm(None, "template", "jl", str(CHART), "--set", "replicas=2", check=False)
    assert out.returncode != 0
    assert "additional properties 'replicas' not allowed" in out.stderr


def test_deployment_is_restricted_and_probed() -> None:
    deploy = render()["Deployment/jl-joblease-operator"]
    pod = deploy["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--health-addr=0.0.0.0:8081" in container["args"]
    assert "resources" not in container
    assert pod["hostNetwork"] is False and "env" not in container


def test_api_server_override_and_host_network() -> None:
    objs = render("apiServerOverride.host=10.1.2.3", "apiServerOverride.port=6443",
                  "hostNetwork=true")
    pod = objs["Deployment/jl-joblease-operator"]["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert env == {"KUBERNETES_SERVICE_HOST": "10.1.2.3", "KUBERNETES_SERVICE_PORT": "6443"}
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"



def test_bind_address_and_host_network_strategy() -> None:
    """Found on the real node: 0.0.0.0 ports on the host, and a surge pod stuck Pending."""
    deploy = render("hostNetwork=true", "bindAddress=127.0.0.1")["Deployment/jl-joblease-operator"]
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert "--metrics-addr=127.0.0.1" in container["args"]
    assert "--health-addr=127.0.0.1:8081" in container["args"]
    assert container["readinessProbe"]["httpGet"]["host"] == "127.0.0.1"
    assert container["livenessProbe"]["httpGet"]["host"] == "127.0.0.1"
    assert deploy["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {
        "maxSurge": 0, "maxUnavailable": 1}}
    default = render()["Deployment/jl-joblease-operator"]
    assert "strategy" not in default["spec"]
    assert "--metrics-addr=0.0.0.0" in default["spec"]["template"]["spec"]["containers"][0][
        "args"]
    custom = render("strategy.type=Recreate")["Deployment/jl-joblease-operator"]
    assert custom["spec"]["strategy"] == {"type": "Recreate"}


def test_policy_exempts_the_operators_service_account() -> None:
    policy = render()["ValidatingAdmissionPolicy/jl-joblease-operator-holder-only"]
    first = policy["spec"]["matchConditions"][0]["expression"]
    assert first == ("request.userInfo.username != "
                     "'system:serviceaccount:joblease-system:jl-joblease-operator'")


def test_admission_and_worker_role_can_be_turned_off() -> None:
    kinds = render("admission.enabled=false", "worker.createRole=false", "metrics.enabled=false")
    assert not [k for k in kinds if "Admission" in k or k.endswith("-worker")
                or k.startswith("Service/")]


def test_exec_probes_open_no_port_and_run_the_packaged_probe() -> None:
    """For replicas on one host network: no healthz port, probes read the heartbeat file."""
    from joblease.controller.heartbeat import PROBE_SOURCE
    deploy = render("hostNetwork=true", "replicaCount=2", "probe.mode=exec",
                    "metrics.enabled=false")["Deployment/jl-joblease-operator"]
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert "ports" not in container
    assert "--health-addr=" in container["args"]
    assert "--health-file=/tmp/joblease-alive" in container["args"]
    liveness = container["livenessProbe"]["exec"]["command"]
    readiness = container["readinessProbe"]["exec"]["command"]
    assert liveness == ["python", "-I", "-c", PROBE_SOURCE, "/tmp/joblease-alive", "30"]
    assert readiness == ["python", "-I", "-c", PROBE_SOURCE, "/tmp/joblease-alive", "10"]


def test_replicas_on_a_host_network_with_ports_are_refused_with_the_fix() -> None:
    out = helm(None, "template", "jl", str(CHART), "--set", "hostNetwork=true",
               "--set", "replicaCount=2", check=False)
    assert out.returncode != 0
    assert "needs probe.mode=exec and metrics.enabled=false" in out.stderr, out.stderr


# -- day-two operations: ServiceMonitor, PrometheusRule, dashboard, PodDisruptionBudget ---

FILES = CHART / "files"


def test_monitoring_objects_are_off_by_default() -> None:
    """Off by default: the chart must install without the Prometheus Operator's CRDs."""
    kinds = {k.split("/")[0] for k in render()}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "ConfigMap", "PodDisruptionBudget"}


def test_service_monitor_selects_the_metrics_service_and_names_the_job() -> None:
    objs = render("serviceMonitor.enabled=true", "serviceMonitor.labels.release=kps",
                  "serviceMonitor.interval=15s")
    monitor = objs["ServiceMonitor/jl-joblease-operator"]
    service = objs["Service/jl-joblease-operator-metrics"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["joblease-system"]}
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    # The alert rules select job="joblease-operator": the monitor must produce that job.
    assert {"action": "replace", "targetLabel": "job",
            "replacement": "joblease-operator"} in endpoint["relabelings"]
    rules = yaml.safe_load((FILES / "alerts.yaml").read_text())
    assert 'up{job="joblease-operator"}' in str(rules)


def test_service_monitor_without_metrics_is_refused_with_the_reason() -> None:
    out = helm(None, "template", "jl", str(CHART), "--set", "serviceMonitor.enabled=true",
               "--set", "metrics.enabled=false", check=False)
    assert out.returncode != 0
    assert "serviceMonitor.enabled needs metrics.enabled" in out.stderr, out.stderr


def test_bad_scrape_interval_is_refused_by_the_schema() -> None:
    out = helm(None, "template", "jl", str(CHART), "--set", "serviceMonitor.interval=30 seconds",
               check=False)
    assert out.returncode != 0 and "/serviceMonitor/interval" in out.stderr, out.stderr


def test_prometheus_rule_renders_exactly_the_promtool_tested_file() -> None:
    rule = render("prometheusRule.enabled=true")["PrometheusRule/jl-joblease-operator"]
    assert rule["spec"]["groups"] == yaml.safe_load((FILES / "alerts.yaml").read_text())["groups"]


def test_alert_labels_are_added_and_the_rules_own_labels_win() -> None:
    rule = render("prometheusRule.enabled=true", "prometheusRule.alertLabels.team=payments",
                  "prometheusRule.alertLabels.severity=info")["PrometheusRule/jl-joblease-operator"]
    shipped = {r["alert"]: r for g in yaml.safe_load((FILES / "alerts.yaml").read_text())["groups"]
               for r in g["rules"]}
    rendered = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert len(rendered) == len(shipped)
    for r in rendered:
        assert r["labels"] == {**shipped[r["alert"]]["labels"], "team": "payments"}
        assert r["expr"] == shipped[r["alert"]]["expr"]


def test_dashboard_config_map_carries_the_file_and_the_sidecar_label() -> None:
    cm = render("grafana.dashboard.enabled=true",
                "grafana.dashboard.annotations.grafana_folder=joblease"
                )["ConfigMap/jl-joblease-operator-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "joblease"}
    assert json.loads(cm["data"]["joblease.json"]) == json.loads(
        (FILES / "dashboard.json").read_text())


def test_pod_disruption_budget_only_with_more_than_one_replica() -> None:
    assert not [k for k in render() if k.startswith("PodDisruptionBudget/")]
    objs = render("replicaCount=2")
    pdb = objs["PodDisruptionBudget/jl-joblease-operator"]
    deploy = objs["Deployment/jl-joblease-operator"]
    assert pdb["spec"]["selector"] == deploy["spec"]["selector"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert render("replicaCount=3", "podDisruptionBudget.minAvailable=50%")[
        "PodDisruptionBudget/jl-joblease-operator"]["spec"]["minAvailable"] == "50%"
    assert not [k for k in render("replicaCount=2", "podDisruptionBudget.enabled=false")
                if k.startswith("PodDisruptionBudget/")]


def test_notes_warn_when_rules_come_without_the_service_monitor() -> None:
    def notes(*sets: str) -> str:
        return helm(None, "install", "jl", str(CHART), "--dry-run=client", "-n", "js",
                    *[a for s in sets for a in ("--set", s)]).stdout

    assert 'scrape job to be named\n   "joblease-operator"' in notes("prometheusRule.enabled=true")
    assert "scrape job to be named" not in notes("prometheusRule.enabled=true",
                                                 "serviceMonitor.enabled=true")


# -- the operator's settings (operator.* values → flags; docs/protocol.md) ------------------

def operator_args(*sets: str) -> list[str]:
    deploy = render(*sets)["Deployment/jl-joblease-operator"]
    args: list[str] = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_every_operator_setting_reaches_the_container_as_its_flag() -> None:
    defaults = operator_args()
    for flag in ("--margin-seconds=0.25", "--writers=8", "--max-server-skew=0",
                 "--clock-track-ttl=60", "--log-level=INFO"):
        assert flag in defaults, defaults
    assert not [a for a in defaults if a.startswith("--namespace")]  # cluster-wide
    custom = operator_args("operator.marginSeconds=0.5", "operator.writers=8",
                           "operator.maxServerSkewSeconds=2.5",
                           "operator.clockTrackTTLSeconds=90", "operator.logLevel=DEBUG",
                           "operator.watchNamespaces={team-a,team-b}")
    for flag in ("--margin-seconds=0.5", "--writers=8", "--max-server-skew=2.5",
                 "--clock-track-ttl=90", "--log-level=DEBUG", "--namespace=team-a",
                 "--namespace=team-b"):
        assert flag in custom, custom


def test_the_rendered_flags_are_accepted_by_the_operators_own_parser() -> None:
    """What the chart renders must parse to the values given (and not be refused at start)."""
    import argparse

    from joblease.controller.settings import OperatorSettings, add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = operator_args("operator.marginSeconds=0.5", "operator.writers=8",
                         "operator.maxServerSkewSeconds=2.5", "operator.clockTrackTTLSeconds=0",
                         "operator.logLevel=WARNING", "operator.watchNamespaces={team-a}")
    settings = OperatorSettings.from_args(parser.parse_args(args), {})
    assert (settings.margin_seconds, settings.writers, settings.max_server_skew,
            settings.clock_track_ttl, settings.log_level, settings.namespaces) == (
        0.5, 8, 2.5, 0.0, "WARNING", ("team-a",))
    assert settings.metrics_addr == "0.0.0.0" and settings.health_addr == "0.0.0.0:8081"


def test_bad_operator_settings_are_refused_by_the_schema() -> None:
    for value, where in [("operator.marginSeconds=-1", "/operator/marginSeconds"),
                         ("operator.marginSeconds=0.5s", "/operator/marginSeconds"),
                         ("operator.maxServerSkewSeconds=-2", "/operator/maxServerSkewSeconds"),
                         ("operator.clockTrackTTLSeconds=a", "/operator/clockTrackTTLSeconds"),
                         ("operator.writers=0", "/operator/writers"),
                         ("operator.writers=65", "/operator/writers"),
                         ("operator.logLevel=verbose", "/operator/logLevel"),
                         ("operator.watchNamespaces={Team-A}", "/operator/watchNamespaces/0"),
                         ("operator.margin=1", "additional properties 'margin' not allowed")]:
        out = helm(None, "template", "jl", str(CHART), "--set", value, check=False)
        assert out.returncode != 0 and where in out.stderr, (value, out.stderr)
    lint = helm(None, "lint", str(CHART), "--strict", "--set", "operator.marginSeconds=-1",
                check=False)
    assert lint.returncode != 0 and "/operator/marginSeconds" in lint.stdout + lint.stderr


def test_extra_args_or_env_that_would_override_a_setting_are_refused() -> None:
    """Both would reach the operator, and one would win silently (or it would not start)."""
    for sets, message in [
        (["extraEnv[0].name=JOBLEASE_MARGIN_SECONDS", "extraEnv[0].value=0.5"],
         "extraEnv sets JOBLEASE_MARGIN_SECONDS, which the chart sets from "
         "operator.marginSeconds"),
        (["extraArgs[0]=--writers=8"], "extraArgs has --writers, which the chart sets from "
                                       "operator.writers"),
        (["extraArgs[0]=--verbose"], "extraArgs has --verbose, which the chart sets from "
                                     "operator.logLevel"),
        (["extraArgs[0]=--namespace", "extraArgs[1]=team-a"],
         "extraArgs has --namespace, which the chart sets from operator.watchNamespaces"),
    ]:
        out = helm(None, "template", "jl", str(CHART),
                   *[a for s in sets for a in ("--set", s)], check=False)
        assert out.returncode != 0 and message in out.stderr, (sets, out.stderr)
    env = render("extraEnv[0].name=TZ", "extraEnv[0].value=UTC")[
        "Deployment/jl-joblease-operator"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "TZ", "value": "UTC"}]
