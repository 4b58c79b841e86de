"""Dashboards and alert rules: generated files current, rules valid for the real promtool,
each alert firing on the series it watches (and silent on healthy ones) under
`promtool test rules`, and both shipped by the chart. The queries run against a real
Prometheus scraping a real run in test_chart_services.py."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from test_helm_chart import VALUES as VALUE_FILES
from test_helm_chart import by_kind, render

from deploygen import dashboards

from helpers import tool

ROOT = dashboards.ROOT


def _promtool() -> str:
    return tool("promtool", installs="`make setup`: apt-get prometheus")


def test_the_generated_files_are_current():
    for rel, text in dashboards.files().items():
        assert (ROOT / rel).read_text() == text, f"{rel} is stale: run `make dashboards`"


def test_promtool_accepts_the_rules():
    out = subprocess.run(
        [_promtool(), "check", "rules", str(ROOT / "deploy/prometheus/specrl-rules.yaml")],
        capture_output=True,
        text=True,
    )
    found = f"SUCCESS: {len(dashboards.ALERTS)} rules found"
    assert out.returncode == 0 and found in out.stdout, out.stdout + out.stderr


# alert -> (input series, eval minute, labels of the alert that must fire then); healthy
# series next to the bad ones must not fire.
CASES = {
    "SpecrlStaleDraft": (
        [
            ("specrl_rollout_stale_draft{instance='r0:9400'}", "1x20"),
            ("specrl_rollout_stale_draft{instance='r1:9400'}", "0x20"),
        ],
        15,
        {"instance": "r0:9400"},
    ),
    "SpecrlAcceptanceCollapse": (
        [
            ("specrl_step_acceptance_length", "1.05x20"),
            ("specrl_rollout_num_speculative_tokens{instance='r0:9400'}", "3x20"),
        ],
        15,
        {},
    ),
    "SpecrlSpeculationNoGain": (
        # r0's draft stopped paying (every range at 1: no drafts); r1 gains at one range
        [
            ("specrl_rollout_adaptive_speedup{instance='r0:9400', batch_sizes='1'}", "1x50"),
            ("specrl_rollout_adaptive_speedup{instance='r0:9400', batch_sizes='2'}", "0.97x50"),
            ("specrl_rollout_adaptive_speedup{instance='r1:9400', batch_sizes='1'}", "1.6x50"),
            ("specrl_rollout_adaptive_speedup{instance='r1:9400', batch_sizes='2'}", "1x50"),
        ],
        35,
        {"instance": "r0:9400"},
    ),
    "SpecrlRolloutStarvation": (
        # the trainer idles 0.8 s of every second (counter +48 per minute); the rate is
        # over 30 minutes (steps minutes apart), so the alert is due 10 minutes after that
        [
            ("specrl_role_idle_seconds_total{role='trainer'}", "0+48x50"),
            ("specrl_role_idle_seconds_total{role='rollout'}", "0+60x50"),
        ],
        45,
        {},
    ),
    "SpecrlPolicyLagBoundHit": (
        [
            ("specrl_samples_total{outcome='stale'}", "0+4x20"),
            ("specrl_samples_total{outcome='trained'}", "0+100x20"),
        ],
        10,
        {},
    ),
    "SpecrlNoLearningSignal": (
        # three steps in a row without signal (step lines every 2 minutes), then one with
        [("specrl_steps_without_signal", "0 0 1 1 2 2 3 3 3 3 0 0")],
        7,
        {},
    ),
    "SpecrlWeightSyncFailures": (
        [
            ("specrl_weight_push_failures_total{kind='draft'}", "0 0 1 1 1"),
            ("specrl_weight_push_failures_total{kind='policy'}", "0x4"),
        ],
        3,
        {"kind": "draft"},
    ),
    "SpecrlSamplerSelfTestFailed": (
        [
            ("specrl_rollout_self_test_passed{instance='r1:9400'}", "0x3"),
            ("specrl_rollout_self_test_passed{instance='r0:9400'}", "1x3"),
            ("specrl_rollout_self_test_passed{instance='r2:9400'}", "-1x3"),  # not run: no alert
        ],
        1,
        {"instance": "r1:9400"},
    ),
}


def test_every_alert_fires_on_its_condition_and_not_on_healthy_series(tmp_path):
    assert set(CASES) == {a.name for a in dashboards.ALERTS}
    alerts = {a.name: a for a in dashboards.ALERTS}
    shutil.copy(ROOT / "deploy/prometheus/specrl-rules.yaml", tmp_path / "rules.yaml")
    tests = []
    for name, (series, minute, labels) in CASES.items():
        a = alerts[name]
        summary = a.summary.replace("{{ $labels.instance }}", labels.get("instance", ""))
        summary = summary.replace("{{ $labels.kind }}", labels.get("kind", ""))
        summary = summary.replace('{{ $value | printf "%.2f" }}', "1.05")
        for label in dashboards.RUN:  # series without a run label (one run, scraped directly)
            summary = summary.replace(f"{{{{ $labels.{label} }}}}", "")
        tests.append(
            {
                "interval": "1m",
                "input_series": [{"series": s.replace("'", '"'), "values": v} for s, v in series],
                "alert_rule_test": [
                    {
                        "eval_time": f"{minute}m",
                        "alertname": name,
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": a.severity, **labels},
                                "exp_annotations": {"summary": summary},
                            }
                        ],
                    },
                    # healthy: before the condition has lasted `for` (or before it began)
                    *(
                        [{"eval_time": "1m", "alertname": name, "exp_alerts": []}]
                        if a.duration != "0m"
                        else []
                    ),
                ],
            }
        )
    spec = tmp_path / "rules.test.yaml"
    spec.write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    out = subprocess.run(
        [_promtool(), "test", "rules", str(spec)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_run_without_speculation_does_not_raise_acceptance_collapse(tmp_path):
    shutil.copy(ROOT / "deploy/prometheus/specrl-rules.yaml", tmp_path / "rules.yaml")
    spec = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": "specrl_step_acceptance_length", "values": "1x30"},
                    {"series": 'specrl_rollout_num_speculative_tokens{instance="r0:9400"}', "values": "0x30"},
                ],
                "alert_rule_test": [
                    {"eval_time": "25m", "alertname": "SpecrlAcceptanceCollapse", "exp_alerts": []}
                ],
            }
        ],
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [_promtool(), "test", "rules", "t.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("dashboard", dashboards.DASHBOARDS, ids=lambda d: d.uid)
def test_dashboards_are_well_formed_grafana_json(dashboard):
    d = dashboards.dashboard_json(dashboard)
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and d["schemaVersion"] >= 36
    cells = {(p["gridPos"]["x"], p["gridPos"]["y"]) for p in d["panels"]}
    assert len(cells) == len(d["panels"]), "panels overlap"
    for p in d["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]


def test_the_chart_ships_the_dashboards_and_the_rules():
    docs = render("--set", "prometheusRule.enabled=true")
    cm = by_kind(docs, "ConfigMap")["rl-specrl-dashboards"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = {json.loads(text)["uid"] for text in cm["data"].values()}
    assert shipped == {d.uid for d in dashboards.DASHBOARDS}
    (rule,) = by_kind(docs, "PrometheusRule").values()
    assert rule["spec"] == dashboards.rules()  # alert annotations kept verbatim ({{ $labels }})
    assert "PrometheusRule" not in {d["kind"] for d in render()}  # off unless the operator is there


def test_the_rl_step_dashboard_shows_the_rollout_scaler_beside_what_it_aims_at():
    """The orchestrator's autoscaler (rollout.orchestratorScaling): its ask beside the
    replicas in the run, its predicted exposed-generation share beside the last step's, and
    each replica's generation throughput, by the names the orchestrator exports them under."""
    from prometheus_client import CollectorRegistry

    from specrl.metrics import OrchestratorMetrics

    m = OrchestratorMetrics(CollectorRegistry())
    (step,) = [d for d in dashboards.DASHBOARDS if d.uid == "specrl-rl-step"]
    panels = dashboards.dashboard_json(step)["panels"]

    def panel_of(*metrics: str) -> dict:
        (found,) = [
            p for p in panels if all(any(f"{x}{{" in t["expr"] for t in p["targets"]) for x in metrics)
        ]
        return found

    scale = panel_of(m.target_replicas._name, m.replicas._name)
    assert len(scale["targets"]) == 2
    share = panel_of(m.predicted_exposed_share._name, m.last_exposed_share._name)
    assert share["fieldConfig"]["defaults"]["unit"] == "percentunit"
    (per_replica,) = panel_of(m.replica_tokens_per_second._name)["targets"]
    assert "by (replica)" in per_replica["expr"] and per_replica["legendFormat"] == "{{replica}}"
    assert m.replica_tokens_per_second._labelnames == ("replica",)
    for p in (scale, share):  # one run's series: the dashboard's variables
        for t in p["targets"]:
            assert 'namespace=~"$namespace",release=~"$release"' in t["expr"], t["expr"]


# --- kube-prometheus-stack, scrape targets, one run among several (issue 30) ------------

RUN = ("namespace", "release")  # the labels that tell one run (Helm release) from another


def test_the_stack_selects_the_monitor_and_the_rules_by_its_release_label():
    """kube-prometheus-stack's Prometheus selects ServiceMonitors and PrometheusRules by
    `release: <the stack's release name>` (serviceMonitorSelectorNilUsesHelmValues,
    ruleSelectorNilUsesHelmValues): the chart carries the stack's default."""
    docs = render("--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        (obj,) = by_kind(docs, kind).values()
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
    other = render(
        *("--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=monitoring"),
    )
    (monitor,) = by_kind(other, "ServiceMonitor").values()
    assert monitor["metadata"]["labels"]["release"] == "monitoring"


def _relabel(rules: list[dict], target: dict[str, str]) -> dict[str, str] | None:
    """Prometheus relabeling (replace, keep, drop; anchored RE2 regexes) of one target."""
    import re

    labels = dict(target)
    for r in rules:
        action = r.get("action", "replace").lower()
        value = r.get("separator", ";").join(labels.get(s, "") for s in r.get("sourceLabels", []))
        match = re.fullmatch(r.get("regex", "(.*)"), value)
        if action == "keep" and not match:
            return None
        if action == "drop" and match:
            return None
        if action == "replace" and match:
            labels[r["targetLabel"]] = match.expand(r.get("replacement", "$1").replace("$", "\\"))
    return labels


def _target(component: str, **pod_labels: str) -> dict[str, str]:
    meta = "__meta_kubernetes_pod_label_"
    labels = {
        "__meta_kubernetes_namespace": "train",
        "__meta_kubernetes_service_label_app_kubernetes_io_instance": "rl",
        f"{meta}app_kubernetes_io_instance": "rl",
        f"{meta}app_kubernetes_io_component": component,
    }
    return labels | {meta + k: v for k, v in pod_labels.items()}


def test_only_pods_that_serve_metrics_are_scraped_and_each_carries_its_run():
    """Only the trainer's global rank 0 serves /metrics (trainer/server.py): the other
    pods of a multi-node trainer are not scraped (no TargetDown for them)."""
    docs = render(*VALUE_FILES["gb200"])
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    (endpoint,) = monitor["spec"]["endpoints"]
    rules = endpoint["relabelings"]
    index, completion = "apps_kubernetes_io_pod_index", "batch_kubernetes_io_job_completion_index"
    scraped = {
        "trainer pod 0": _target("trainer", **{index: "0"}),
        "jobset trainer pod 0": _target("trainer", **{completion: "0"}),
        "rollout pod 7": _target("rollout", **{index: "7"}),
        "draft-trainer": _target("draft-trainer", **{index: "0"}),
        "orchestrator": _target("orchestrator"),
    }
    for name, target in scraped.items():
        kept = _relabel(rules, target)
        assert kept is not None, name
        assert kept["release"] == "rl", name  # the run label the dashboards and alerts use
    for name, target in {
        "trainer pod 1": _target("trainer", **{index: "1"}),
        "trainer pod 12": _target("trainer", **{index: "12"}),
        "jobset trainer pod 3": _target("trainer", **{completion: "3"}),
    }.items():
        assert _relabel(rules, target) is None, name


def _selectors(expr: str) -> list[str]:
    import re

    return [m.group(0) for m in re.finditer(r"\bspecrl_[a-z0-9_]+(\{[^}]*\})?", expr)]


@pytest.mark.parametrize("dashboard", dashboards.DASHBOARDS, ids=lambda d: d.uid)
def test_every_panel_shows_one_namespace_and_run(dashboard):
    d = dashboards.dashboard_json(dashboard)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    for name in RUN:
        assert variables[name]["type"] == "query", name
        assert variables[name]["datasource"]["uid"] == "${datasource}", name
    assert "$namespace" in variables["release"]["query"]["query"]  # runs of the chosen namespace
    for p in d["panels"]:
        for t in p["targets"]:
            for sel in _selectors(t["expr"]):
                for name in RUN:
                    assert f'{name}=~"${name}"' in sel, (p["title"], sel)


def test_the_queries_run_as_given_evaluate_every_run():
    """dashboards.queries() (what the live-cluster test runs): the variables set to all."""
    for uid, title, expr in dashboards.queries():
        assert "$namespace" not in expr and "$release" not in expr, (uid, title)
        for sel in _selectors(expr):
            assert 'namespace=~".*"' in sel, (uid, title, sel)


def test_every_alert_is_per_run():
    for a in dashboards.ALERTS:
        for agg in ("sum", "max", "min"):
            for part in a.expr.split(f"{agg}")[1:]:
                if part.lstrip().startswith(("(", "by")):  # an aggregation
                    assert part.lstrip().startswith("by (namespace, release"), (a.name, a.expr)


def test_two_runs_in_one_cluster_are_not_summed(tmp_path):
    """Two runs whose trainers each idle 0.3 s/s are not one run idling 0.6 s/s; a run
    idling 0.8 s/s next to a healthy one raises the alert for that run only."""
    shutil.copy(ROOT / "deploy/prometheus/specrl-rules.yaml", tmp_path / "rules.yaml")

    def idle(ns: str, release: str, per_min: int) -> dict:
        labels = f'role="trainer",namespace="{ns}",release="{release}"'
        return {"series": f"specrl_role_idle_seconds_total{{{labels}}}", "values": f"0+{per_min}x60"}

    summary = next(a.summary for a in dashboards.ALERTS if a.name == "SpecrlRolloutStarvation")
    spec = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [idle("a", "rl", 18), idle("b", "rl", 18)],
                "alert_rule_test": [
                    {"eval_time": "45m", "alertname": "SpecrlRolloutStarvation", "exp_alerts": []}
                ],
            },
            {
                "interval": "1m",
                "input_series": [idle("a", "rl", 48), idle("a", "other", 6)],
                "alert_rule_test": [
                    {
                        "eval_time": "45m",
                        "alertname": "SpecrlRolloutStarvation",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "namespace": "a", "release": "rl"},
                                "exp_annotations": {
                                    "summary": summary.replace("{{ $labels.namespace }}", "a").replace(
                                        "{{ $labels.release }}", "rl"
                                    )
                                },
                            }
                        ],
                    }
                ],
            },
        ],
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [_promtool(), "test", "rules", "t.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --- steps minutes apart (issue 31): every panel reads a number between two steps -------

SCRAPE_S = 15  # the scrape interval; Grafana's $__rate_interval is 4 of them
STEP_MIN = 5  # a 30k-token GB200 run: one RL step every 5 minutes
STEPS = 8
LABEL_VALUES = {  # the label values the panels select (others: any one value)
    "stage": (*__import__("specrl.metrics").metrics.STAGES,),
    "stat": ("loss", "kl", "entropy", "grad_norm", "clip_fraction"),
    "outcome": ("trained", "stale"),
    "role": ("trainer", "rollout"),
    "kind": ("policy", "draft"),
    "queue": ("prompts", "rollouts"),
    "position": ("0", "1", "2"),
    "batch_sizes": ("1-8",),
    "k": ("2",),
    "status": ("ok",),
    "reason": ("too_long",),
    "source": ("history", "model"),
}


def _series_of_a_run_with_steps_minutes_apart() -> list[dict]:
    """Every series the services export, as scraped every 15 s from a run whose steps end
    every 5 minutes: what steps observe (counters, histograms) grows once a step, at its
    end, as do the rollout counters (a 30k-token Generate call returns its samples at
    once); gauges hold a value."""
    import itertools

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from specrl import metrics

    registry = CollectorRegistry()
    owners = (
        metrics.RolloutMetrics,
        metrics.WeightSenderMetrics,
        metrics.TrainerMetrics,
        metrics.DraftMetrics,
        metrics.OrchestratorMetrics,
    )
    for owner in (cls(registry) for cls in owners):
        for m in vars(owner).values():
            if isinstance(m, (Counter, Gauge, Histogram)) and m._labelnames:
                for values in itertools.product(*(LABEL_VALUES.get(n, ("a",)) for n in m._labelnames)):
                    m.labels(*values)
    per_step = 60 // SCRAPE_S * STEP_MIN  # scrapes per step
    out = []
    for family in registry.collect():
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            labels = {**s.labels, "instance": "r0:9400", "namespace": "train", "release": "rl"}
            selector = s.name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
            if family.type == "gauge":
                values = f"1x{per_step * STEPS - 1}"
            else:  # one more observation (or count) at the end of every step
                values = " ".join(f"{n}x{per_step - 1}" for n in range(STEPS))
            out.append({"series": selector, "values": values})
    return out


def test_every_panel_reads_a_number_at_every_minute_between_steps_minutes_apart(tmp_path):
    """A rate over Grafana's $__rate_interval (a minute at a 15 s scrape) of something a
    step observes once is 0/0 between two steps 5 minutes apart: the panel goes blank.
    Every panel query, as Grafana runs it, returns numbers (no NaN, not empty) at every
    minute of a run with 5-minute steps, from the second step on."""
    shutil.copy(ROOT / "deploy/prometheus/specrl-rules.yaml", tmp_path / "rules.yaml")
    checks, titles = [], {}
    for uid, title, expr in dashboards.queries():
        q = f"({expr.replace(dashboards.RATE, f'{4 * SCRAPE_S}s')})"
        titles[q] = f"{uid} / {title}"
        for minute in range(2 * STEP_MIN + 1, (STEPS - 1) * STEP_MIN):
            checks.append(
                {
                    # every series a number (x == x is false for NaN), and some series
                    "expr": f"count({q} == {q}) == bool count({q})",
                    "eval_time": f"{minute}m",
                    "exp_samples": [{"labels": "{}", "value": 1}],
                }
            )
    spec = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": f"{SCRAPE_S}s",
                "input_series": _series_of_a_run_with_steps_minutes_apart(),
                "promql_expr_test": checks,
            }
        ],
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(spec, width=10_000))
    out = subprocess.run(
        [_promtool(), "test", "rules", "t.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    said = out.stdout + out.stderr
    blank = sorted({t for q, t in titles.items() if json.dumps(q)[1:-1] in said})  # as Go quotes it
    assert out.returncode == 0, "panels blank between steps:\n" + "\n".join(blank) + "\n" + said[-2000:]


@pytest.mark.parametrize("step_min", [5, 15])
def test_starvation_is_raised_and_held_when_steps_are_minutes_apart(tmp_path, step_min):
    """The trainer idles 80% of every step, its idle counter growing once a step at the
    step's end: the alert fires and stays firing, not flapping with the steps (a rate
    over 10 minutes holds no step at all between two steps 15 minutes apart)."""
    shutil.copy(ROOT / "deploy/prometheus/specrl-rules.yaml", tmp_path / "rules.yaml")
    per_step = 60 // SCRAPE_S * step_min
    idle = " ".join(f"{0.8 * 60 * step_min * n}x{per_step - 1}" for n in range(120 // step_min))
    alert = next(a for a in dashboards.ALERTS if a.name == "SpecrlRolloutStarvation")
    summary = alert.summary.replace("{{ $labels.namespace }}", "a").replace("{{ $labels.release }}", "rl")
    firing = [
        {
            "exp_labels": {"severity": alert.severity, "namespace": "a", "release": "rl"},
            "exp_annotations": {"summary": summary},
        }
    ]
    spec = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": f"{SCRAPE_S}s",
                "input_series": [
                    {
                        "series": 'specrl_role_idle_seconds_total{role="trainer",namespace="a",release="rl"}',
                        "values": idle,
                    }
                ],
                "alert_rule_test": [
                    {"eval_time": f"{minute}m", "alertname": alert.name, "exp_alerts": firing}
                    for minute in range(60, 115)
                ],
            }
        ],
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(spec))
    out = subprocess.run(
        [_promtool(), "test", "rules", "t.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr
