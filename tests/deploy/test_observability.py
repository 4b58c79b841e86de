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
    "SpecrlRolloutStarvation": (
        # the trainer idles 0.8 s of every second (counter +48 per minute)
        [
            ("specrl_role_idle_seconds_total{role='trainer'}", "0+48x30"),
            ("specrl_role_idle_seconds_total{role='rollout'}", "0+60x30"),
        ],
        25,
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
