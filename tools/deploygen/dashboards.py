"""Grafana dashboards and Prometheus alert rules as code, over the metrics specrl's
services export (specrl.metrics), under the names they export them.

`make dashboards` writes the dashboards to deploy/grafana/*.json and the rules to
deploy/prometheus/specrl-rules.yaml, plus the chart's copies (deploy/helm/specrl/files/,
shipped as a Grafana-sidecar ConfigMap and a PrometheusRule). Tests run every query of
every panel and every rule against a real Prometheus scraping a real run, and
`promtool test rules` makes each alert fire on the series it watches.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RATE = "$__rate_interval"  # Grafana's: at least four scrape intervals
STACKED_STAGES = 'stage!="gen"'  # gen spans the batch and overlaps the others in async RL


def rate(series: str, by: str = "", fn: str = "rate") -> str:
    """Per-second rate (or `fn`: increase) of a counter, summed over series, `by` labels."""
    group = f" by ({by})" if by else ""
    return f"sum{group} ({fn}({series}[{RATE}]))"


def mean(histogram: str, by: str = "", where: str = "") -> str:
    """Mean of a histogram's observations over the rate window, `where` a label matcher."""
    sel = f"{{{where}}}" if where else ""
    return f"{rate(f'{histogram}_sum{sel}', by)} / {rate(f'{histogram}_count{sel}', by)}"


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    stacked: bool = False


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = field(default=("specrl",))


DASHBOARDS = (
    Dashboard(
        "specrl-rl-step",
        "specrl / RL step",
        "Where an RL step's time goes, and how much generation the trainer waits for.",
        (
            Panel(
                "Stage time per step (stacked)",
                ((mean("specrl_step_stage_seconds", "stage", STACKED_STAGES), "{{stage}}"),),
                unit="s",
                stacked=True,
                description="data, prepare, exposed_generation, reward, logprob, train, checkpoint, other",
            ),
            Panel(
                "Exposed generation time",
                ((mean("specrl_exposed_generation_seconds"), "exposed generation"),),
                unit="s",
                description="Time the trainer waited for rollouts: all of generation in sync RL, "
                "the part not hidden behind training in async RL.",
            ),
            Panel(
                "Step time",
                (
                    (mean("specrl_step_seconds"), "step"),
                    (mean("specrl_step_stage_seconds", where='stage="gen"'), "gen"),
                ),
                unit="s",
            ),
            Panel(
                "Exposed generation share of the step",
                (
                    (
                        " / ".join(rate(f"specrl_{h}_seconds_sum") for h in ("exposed_generation", "step")),
                        "exposed / step",
                    ),
                ),
                unit="percentunit",
            ),
            Panel("RL steps per minute", ((f"{rate('specrl_steps_total')} * 60", "steps/min"),)),
            Panel(
                "Idle fraction per role",
                ((rate("specrl_role_idle_seconds_total", "role"), "{{role}}"),),
                unit="percentunit",
            ),
            Panel(
                "Groups without learning signal (all samples the same reward)",
                (("specrl_step_zero_variance_groups_ratio", "share of the step's groups"),),
                unit="percentunit",
            ),
        ),
    ),
    Dashboard(
        "specrl-speculation",
        "specrl / Speculation",
        "Speculative decoding in the rollouts: acceptance, the draft's quality, throughput.",
        (
            Panel(
                "Acceptance length",
                (
                    ("specrl_step_acceptance_length", "last RL step"),
                    (
                        f"1 + {rate('specrl_rollout_spec_accepted_tokens_total', 'instance')}"
                        f" / {rate('specrl_rollout_spec_drafts_total', 'instance')}",
                        "measured {{instance}}",
                    ),
                    ("specrl_draft_acceptance_length_estimate", "draft-trainer held-out estimate"),
                ),
                description="Tokens per target verification step; 1 is no speculation.",
            ),
            Panel(
                "Acceptance rate per draft position",
                (
                    (
                        f"{rate('specrl_rollout_spec_accepted_tokens_per_position_total', 'position')}"
                        f" / ignoring(position) group_left {rate('specrl_rollout_spec_drafts_total')}",
                        "position {{position}}",
                    ),
                ),
                unit="percentunit",
            ),
            Panel(
                "Draft held-out agreement per position",
                (("specrl_draft_heldout_agreement", "position {{position}}"),),
                unit="percentunit",
            ),
            Panel("Draft training loss", (("specrl_draft_loss", "TTT loss"),)),
            Panel(
                "Draft version lag (policy versions behind)",
                (("max by (instance) (specrl_rollout_draft_lag_versions)", "{{instance}}"),),
            ),
            Panel(
                "Generated tokens/s per replica",
                (
                    (
                        rate("specrl_rollout_generated_tokens_total", "instance"),
                        "{{instance}}",
                    ),
                ),
                unit="tps",
            ),
            Panel(
                "Draft length k",
                (("max by (instance) (specrl_rollout_num_speculative_tokens)", "{{instance}}"),),
            ),
            Panel(
                "Adaptive k by engine batch size",
                (
                    ("specrl_rollout_adaptive_k", "{{instance}} batch {{batch_sizes}}"),
                    ("specrl_rollout_drafter_paused", "{{instance}} drafter paused"),
                ),
                description="The draft length the adaptive controller set per range of engine "
                "batch sizes (speculation.adaptive); 0 is speculation off. Drafter paused (1): "
                "k=0 at every batch size, the draft model does not run at all.",
            ),
            Panel(
                "Adaptive controller: estimated tokens/s by k",
                (
                    (
                        "specrl_rollout_adaptive_tokens_per_second",
                        "{{instance}} batch {{batch_sizes}} k={{k}}",
                    ),
                ),
                unit="tps",
                description="Measured step cost with measured acceptance, per k the controller has "
                "measured; it keeps the fastest, and k=0 unless speculation wins by ar_margin.",
            ),
        ),
    ),
    Dashboard(
        "specrl-weights",
        "specrl / Weights & lag",
        "Weight broadcast to the rollout servers, policy lag and the run's queues.",
        (
            Panel(
                "Weight push time",
                ((mean("specrl_weight_push_seconds", "kind"), "{{kind}}"),),
                unit="s",
            ),
            Panel(
                "Weight push bandwidth",
                (("max by (kind) (specrl_weight_push_bandwidth_bytes_per_second)", "{{kind}}"),),
                unit="Bps",
            ),
            Panel(
                "Weight sync time on the replicas",
                ((mean("specrl_weight_sync_seconds", "kind"), "{{kind}}"),),
                unit="s",
            ),
            Panel(
                "Policy lag (samples)",
                (
                    (
                        f"histogram_quantile(0.5, {rate('specrl_policy_lag_bucket', 'le')})",
                        "p50",
                    ),
                    (
                        f"histogram_quantile(0.95, {rate('specrl_policy_lag_bucket', 'le')})",
                        "p95",
                    ),
                ),
            ),
            Panel(
                "Queue depths and rollout replicas",
                (
                    ("sum by (queue) (specrl_queue_depth)", "{{queue}}"),
                    ("specrl_rollout_replicas", "replicas"),
                ),
            ),
            Panel(
                "Versions",
                (
                    ("specrl_policy_version", "trainer policy"),
                    ("min(specrl_rollout_policy_version)", "oldest policy served"),
                    ("max(specrl_draft_published_version)", "draft published"),
                ),
            ),
            Panel(
                "Weight push failures",
                ((f"{rate('specrl_weight_push_failures_total', fn='increase')} or vector(0)", "failures"),),
            ),
            Panel(
                "Samples dropped beyond the lag bound",
                ((rate('specrl_samples_total{outcome="stale"}') + " or vector(0)", "stale/s"),),
            ),
        ),
    ),
    Dashboard(
        "specrl-training",
        "specrl / Training",
        "The policy's training: reward, KL, loss, and the engine/trainer logprob mismatch.",
        (
            Panel("Reward (mean of the last step)", (("specrl_step_reward_mean", "reward"),)),
            Panel("KL to the reference", (('specrl_trainer_step_value{stat="kl"}', "kl"),)),
            Panel(
                "Loss, entropy, grad norm",
                (('specrl_trainer_step_value{stat=~"loss|entropy|grad_norm|clip_fraction"}', "{{stat}}"),),
            ),
            Panel(
                "Engine vs trainer logprob mismatch",
                (
                    ("specrl_trainer_logprob_mismatch_kl", "KL"),
                    ("specrl_trainer_logprob_mismatch_max_abs", "max |diff|"),
                ),
            ),
            Panel("Trainer tokens/s", (("specrl_trainer_tokens_per_second", "tokens/s"),), unit="tps"),
            Panel(
                "Trainer stage time",
                ((mean("specrl_trainer_stage_seconds", "stage"), "{{stage}}"),),
                unit="s",
            ),
        ),
    ),
)


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    duration: str
    severity: str
    summary: str


ALERTS = (
    Alert(
        "SpecrlStaleDraft",
        "max by (instance) (specrl_rollout_stale_draft) == 1",
        "10m",
        "warning",
        "Rollout server {{ $labels.instance }} serves a draft trained against a policy too old "
        "(speculation still lossless, but slower).",
    ),
    Alert(
        "SpecrlAcceptanceCollapse",
        "specrl_step_acceptance_length < 1.2 and on () (max(specrl_rollout_num_speculative_tokens) > 0)",
        "10m",
        "warning",
        'Acceptance length {{ $value | printf "%.2f" }} < 1.2 with speculation on: the draft no '
        "longer pays for itself.",
    ),
    Alert(
        "SpecrlRolloutStarvation",
        'sum(rate(specrl_role_idle_seconds_total{role="trainer"}[10m])) > 0.5',
        "10m",
        "warning",
        "The trainer waits for rollouts more than half the time: add rollout replicas or raise "
        "the policy lag.",
    ),
    Alert(
        "SpecrlPolicyLagBoundHit",
        'sum(increase(specrl_samples_total{outcome="stale"}[10m])) > 0',
        "5m",
        "info",
        "Samples are dropped beyond the policy-lag bound (generated work wasted).",
    ),
    Alert(
        "SpecrlNoLearningSignal",
        "max(specrl_steps_without_signal) >= 3",
        "0m",
        "warning",
        "3 or more steps in a row in which every group's samples got the same reward: GRPO learns "
        "nothing (answers not read right, or the task too hard or too easy; `specrl data check`).",
    ),
    Alert(
        "SpecrlWeightSyncFailures",
        "sum by (kind) (increase(specrl_weight_push_failures_total[10m])) > 0",
        "0m",
        "critical",
        "{{ $labels.kind }} weight pushes to the rollout servers are failing.",
    ),
    Alert(
        "SpecrlSamplerSelfTestFailed",
        "min by (instance) (specrl_rollout_self_test_passed) == 0",
        "0m",
        "critical",
        "Rollout server {{ $labels.instance }} failed its lossless sampler self-test.",
    ),
)


def _panel_json(p: Panel, i: int) -> dict[str, Any]:
    custom: dict[str, Any] = {"drawStyle": "line", "fillOpacity": 10, "lineWidth": 1}
    if p.stacked:
        custom.update({"drawStyle": "bars", "fillOpacity": 80, "stacking": {"mode": "normal", "group": "A"}})
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": p.title,
        "description": p.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": p.unit, "custom": custom}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend, "range": True}
            for j, (expr, legend) in enumerate(p.queries)
        ],
    }


def dashboard_json(d: Dashboard) -> dict[str, Any]:
    return {
        "uid": d.uid,
        "title": d.title,
        "description": d.description,
        "tags": list(d.tags),
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                }
            ]
        },
        "panels": [_panel_json(p, i) for i, p in enumerate(d.panels)],
    }


def rules() -> dict[str, Any]:
    return {
        "groups": [
            {
                "name": "specrl",
                "rules": [
                    {
                        "alert": a.name,
                        "expr": a.expr,
                        "for": a.duration,
                        "labels": {"severity": a.severity},
                        "annotations": {"summary": a.summary},
                    }
                    for a in ALERTS
                ],
            }
        ]
    }


def queries() -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) of every panel query."""
    return [(d.uid, p.title, expr) for d in DASHBOARDS for p in d.panels for expr, _ in p.queries]


def files() -> dict[str, str]:
    """Generated files by path relative to the repository root."""
    out: dict[str, str] = {}
    for d in DASHBOARDS:
        text = json.dumps(dashboard_json(d), indent=2) + "\n"
        name = d.uid.removeprefix("specrl-") + ".json"
        out[f"deploy/grafana/{name}"] = text
        out[f"deploy/helm/specrl/files/dashboards/{name}"] = text
    text = yaml.safe_dump(rules(), sort_keys=False, width=200)
    out["deploy/prometheus/specrl-rules.yaml"] = text
    out["deploy/helm/specrl/files/rules/specrl-rules.yaml"] = text
    return out


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for rel, text in files().items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(files())} files under {root}")


if __name__ == "__main__":
    main()
