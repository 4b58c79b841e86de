"""Grafana dashboards and Prometheus alert rules as code, over the metrics specrl's
services export (specrl.metrics), under the names they export them.

`make dashboards` writes the dashboards to deploy/grafana/*.json and the rules to
deploy/prometheus/specrl-rules.yaml, plus the chart's copies (deploy/helm/specrl/files/,
shipped as a Grafana-sidecar ConfigMap and a PrometheusRule). Tests run every query of
every panel and every rule against a real Prometheus scraping a real run, and
`promtool test rules` makes each alert fire on the series it watches.

One Prometheus may watch several runs (Helm releases, in one namespace or several): the
chart's ServiceMonitor gives every series the `namespace` of its pod and the `release`
it belongs to (RUN). Every panel query selects one namespace and run through the
dashboards' variables of those names; every alert aggregates by them, so two runs are
never summed into one.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RATE = "$__rate_interval"  # Grafana's: at least four scrape intervals
# What a step observes once (a histogram observation, a counter's increment at the step's
# end, a rollout counter counted when a Generate call returns) shows in a rate over RATE
# only in the minute after it: between two steps minutes apart (a 30k-token GB200 run
# steps every 5 minutes) such a rate is 0/0 and the panel blank. Per-step values are
# therefore read from gauges holding the last step's (specrl_last_step_*, set as a step
# ends); a rate that is really meant is taken over STEPS_WINDOW, which holds several steps
# of 5 minutes and at least one of up to 30.
STEPS_WINDOW = "30m"
STACKED_STAGES = 'stage!="gen"'  # gen spans the batch and overlaps the others in async RL
# The labels that tell one run from another: the pod's namespace (Prometheus adds it) and
# the Helm release (the chart's ServiceMonitor relabels app.kubernetes.io/instance to it).
RUN = ("namespace", "release")
PER_RUN = ", ".join(RUN)
# What each panel's metric selectors match: the dashboard's variables of the same names.
RUN_MATCHERS = ",".join(f'{label}=~"${label}"' for label in RUN)
_SELECTOR = re.compile(r"\b(specrl_[a-z0-9_]+)(\{([^}]*)\})?")


def scoped(expr: str, matchers: str = RUN_MATCHERS) -> str:
    """`expr` with `matchers` added to every specrl metric selector in it."""

    def add(m: re.Match) -> str:
        inner = m.group(3)
        return f"{m.group(1)}{{{matchers}{', ' + inner if inner else ''}}}"

    return _SELECTOR.sub(add, expr)


def rate(series: str, by: str = "", fn: str = "rate", window: str = RATE) -> str:
    """Per-second rate (or `fn`: increase) of a counter over `window`, summed over series,
    `by` labels."""
    group = f" by ({by})" if by else ""
    return f"sum{group} ({fn}({series}[{window}]))"


def steps_rate(series: str, by: str = "") -> str:
    """`rate` over STEPS_WINDOW: of a counter that grows once a step or per Generate call."""
    return rate(series, by, window=STEPS_WINDOW)


def mean(histogram: str, by: str = "", where: str = "", window: str = STEPS_WINDOW) -> str:
    """Mean of a histogram's observations over `window` (by default one spanning steps: the
    histograms are observed once a step or a weight push), `where` a label matcher."""
    sel = f"{{{where}}}" if where else ""
    return (
        f"{rate(f'{histogram}_sum{sel}', by, window=window)}"
        f" / {rate(f'{histogram}_count{sel}', by, window=window)}"
    )


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
                ((f"max by (stage) (specrl_last_step_stage_seconds{{{STACKED_STAGES}}})", "{{stage}}"),),
                unit="s",
                stacked=True,
                description="The last step's data, prepare, exposed_generation, reward, logprob, "
                "train, checkpoint, other (held until the next step ends).",
            ),
            Panel(
                "Exposed generation time",
                (('max(specrl_last_step_stage_seconds{stage="exposed_generation"})', "exposed generation"),),
                unit="s",
                description="Time the trainer waited for rollouts in the last step: all of "
                "generation in sync RL, the part not hidden behind training in async RL.",
            ),
            Panel(
                "Step time",
                (
                    ("max(specrl_last_step_seconds)", "step"),
                    ('max(specrl_last_step_stage_seconds{stage="gen"})', "gen"),
                ),
                unit="s",
                description="Wall time of the last step, and the span of its batch's generation.",
            ),
            Panel(
                "Exposed generation share of the step",
                (("max(specrl_last_step_exposed_generation_share)", "exposed / step"),),
                unit="percentunit",
            ),
            Panel(
                "RL steps per minute",
                (
                    ("60 / max(specrl_last_step_seconds > 0)", "at the last step's pace"),
                    (f"{steps_rate('specrl_steps_total')} * 60", f"mean over {STEPS_WINDOW}"),
                ),
            ),
            Panel(
                "Idle fraction per role",
                (("max by (role) (specrl_last_step_idle_share)", "{{role}}"),),
                unit="percentunit",
                description="Share of the last step's wall time the trainer waited (for rollouts "
                "or weights) and no Generate call was in flight on any replica.",
            ),
            Panel(
                "Idle share per rollout replica",
                ((steps_rate("specrl_rollout_replica_idle_seconds_total", "replica"), "{{replica}}"),),
                unit="percentunit",
                description=f"Share of the last {STEPS_WINDOW} with no Generate call of the run "
                "in flight on the replica: one idle replica among many, which the fleet's idle "
                "fraction hides.",
            ),
            Panel(
                "Generation load per replica",
                (
                    (
                        "max by (replica) (specrl_generation_in_flight)"
                        " / max by (replica) (specrl_generation_slots)",
                        "{{replica}} calls in flight / slots",
                    ),
                ),
                unit="percentunit",
            ),
            Panel(
                "Generation demand",
                (("max(specrl_generation_demand_sequences)", "sequences wanted now"),),
                description="Samples per group x prompt groups admitted and not yet generated: "
                "what rollout.keda (trigger demand) and the HPA (rollout.autoscaling, External "
                "metric) divide by a replica's max_num_seqs.",
            ),
            Panel(
                "Rollout replicas: asked for vs in the run",
                (
                    ("max(specrl_rollout_target_replicas)", "asked for (orchestrator autoscaler)"),
                    ("max(specrl_rollout_replicas)", "in the run"),
                ),
                description="What the orchestrator's autoscaler (rollout.orchestratorScaling) "
                "last set the rollout workload's scale to, beside the replicas the loop generates "
                "on: they differ while new pods start, load the model and take the current "
                "policy. Without that scaler the ask stays 0.",
            ),
            Panel(
                "Exposed generation share: predicted vs measured",
                (
                    (
                        "max(specrl_rollout_autoscale_predicted_exposed_share)",
                        "predicted at the replicas asked for",
                    ),
                    ("max(specrl_last_step_exposed_generation_share)", "last step"),
                ),
                unit="percentunit",
                description="The share of a step the trainer waits for rollouts, as the "
                "orchestrator's autoscaler predicts it at the replica count it asked for (it aims "
                "at rollout.orchestratorScaling.targetExposedShare), beside the last step's.",
            ),
            Panel(
                "Generation throughput per replica",
                (("max by (replica) (specrl_rollout_replica_tokens_per_second)", "{{replica}}"),),
                unit="tps",
                description="Tokens each replica's engine generated per second between the "
                "orchestrator's last two reads of its status (every request it served): its "
                "load, read as it runs rather than when a Generate call returns.",
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
                        f"1 + {steps_rate('specrl_rollout_spec_accepted_tokens_total', 'instance')}"
                        f" / {steps_rate('specrl_rollout_spec_drafts_total', 'instance')}",
                        f"measured {{{{instance}}}} ({STEPS_WINDOW})",
                    ),
                    ("specrl_draft_acceptance_length_estimate", "draft-trainer held-out estimate"),
                ),
                description="Tokens per target verification step; 1 is no speculation. A "
                f"replica counts a sample's drafts when its Generate call returns: measured over "
                f"{STEPS_WINDOW}.",
            ),
            Panel(
                "Acceptance rate per draft position",
                (
                    (
                        f"{steps_rate('specrl_rollout_spec_accepted_tokens_per_position_total', 'position')}"
                        " / ignoring(position) group_left "
                        f"{steps_rate('specrl_rollout_spec_drafts_total')}",
                        "position {{position}}",
                    ),
                ),
                unit="percentunit",
                description=f"Over {STEPS_WINDOW}: counted as Generate calls return.",
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
                        steps_rate("specrl_rollout_generated_tokens_total", "instance"),
                        "{{instance}}",
                    ),
                ),
                unit="tps",
                description=f"Over {STEPS_WINDOW}: a replica counts a sample's tokens when its "
                "Generate call returns (minutes for 30k tokens), so a shorter window swings "
                "between 0 and bursts.",
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
            Panel(
                "Net gain: generation speedup over no speculation",
                (("specrl_rollout_adaptive_speedup", "{{instance}} batch {{batch_sizes}}"),),
                description="The adaptive controller's estimate per range of engine batch sizes: "
                "output rate at the k in force over the rate without drafts (1: it runs without "
                "drafts). A draft that stops paying (wiped or mismatched after a weight update, "
                "too weak for the policy) drops here first.",
            ),
            Panel(
                "Hybrid: share of request steps drafted from history",
                (
                    (
                        steps_rate('specrl_rollout_history_rows_total{source="history"}', "instance")
                        + f" / {steps_rate('specrl_rollout_history_rows_total', 'instance')}",
                        "{{instance}}",
                    ),
                    (
                        steps_rate("specrl_rollout_history_extended_rows_total", "instance")
                        + f" / {steps_rate('specrl_rollout_history_rows_total', 'instance')}",
                        "{{instance}} model's drafts extended",
                    ),
                ),
                unit="percentunit",
                description="Replicas with speculation.history.hybrid: the request steps drafted "
                "from the run's own history (earlier epochs' responses, siblings, the prompt) "
                "against those the draft model drafted, over "
                f"{STEPS_WINDOW}, and the share whose draft-model draft history extended past "
                "the model's k. History's own drafts: near 0 in a first epoch or on new prompts "
                "(the draft model drafts), rising from the second epoch where responses repeat "
                "earlier ones; a replica read every 10 s at most (docs/draft.md).",
            ),
            Panel(
                "History held (tokens)",
                (("specrl_rollout_history_tokens", "{{instance}}"),),
                description="Tokens each replica's history drafter holds (speculation method "
                "history, or the hybrid): earlier responses per prompt, aged out after "
                "speculation.history.max_age policy versions and capped by max_tokens.",
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
                        f"histogram_quantile(0.5, {steps_rate('specrl_policy_lag_bucket', 'le')})",
                        "p50",
                    ),
                    (
                        f"histogram_quantile(0.95, {steps_rate('specrl_policy_lag_bucket', 'le')})",
                        "p95",
                    ),
                ),
                description=f"Of the samples trained on over {STEPS_WINDOW} (observed once a step).",
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
                (
                    (
                        steps_rate('specrl_samples_total{outcome="stale"}') + " or vector(0)",
                        f"stale/s ({STEPS_WINDOW})",
                    ),
                ),
                description="Counted once a step, at its end: over a window of several steps.",
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


# Which run an alert is about, first in every summary.
RUN_IN = "Run {{ $labels.release }} in {{ $labels.namespace }}:"

ALERTS = (
    Alert(
        "SpecrlStaleDraft",
        f"max by ({PER_RUN}, instance) (specrl_rollout_stale_draft) == 1",
        "10m",
        "warning",
        f"{RUN_IN} Rollout server {{{{ $labels.instance }}}} serves a draft trained against a policy too old "
        "(speculation still lossless, but slower).",
    ),
    Alert(
        "SpecrlAcceptanceCollapse",
        f"max by ({PER_RUN}) (specrl_step_acceptance_length) < 1.2"
        f" and on ({PER_RUN}) (max by ({PER_RUN}) (specrl_rollout_num_speculative_tokens) > 0)",
        "10m",
        "warning",
        f'{RUN_IN} Acceptance length {{{{ $value | printf "%.2f" }}}} < 1.2 with speculation on: '
        "the draft no longer pays for itself.",
    ),
    Alert(
        "SpecrlSpeculationNoGain",
        f"max by ({PER_RUN}, instance) (specrl_rollout_adaptive_speedup) <= 1",
        "30m",
        "warning",
        f"{RUN_IN} Rollout server {{{{ $labels.instance }}}}: speculation has brought no gain at any batch "
        "size for 30 minutes (the adaptive controller runs without drafts): a draft wiped or mismatched "
        "after a weight update, or too weak for this policy.",
    ),
    Alert(
        "SpecrlRolloutStarvation",
        # over a window of several steps: the idle counter grows once a step, at its end
        f'sum by ({PER_RUN}) (rate(specrl_role_idle_seconds_total{{role="trainer"}}[{STEPS_WINDOW}])) > 0.5',
        "10m",
        "warning",
        f"{RUN_IN} The trainer waits for rollouts more than half the time: add rollout replicas or raise "
        "the policy lag.",
    ),
    Alert(
        "SpecrlPolicyLagBoundHit",
        f'sum by ({PER_RUN}) (increase(specrl_samples_total{{outcome="stale"}}[10m])) > 0',
        "5m",
        "info",
        f"{RUN_IN} Samples are dropped beyond the policy-lag bound (generated work wasted).",
    ),
    Alert(
        "SpecrlNoLearningSignal",
        f"max by ({PER_RUN}) (specrl_steps_without_signal) >= 3",
        "0m",
        "warning",
        f"{RUN_IN} 3 or more steps in a row in which every group's samples got the same reward: GRPO learns "
        "nothing (answers not read right, or the task too hard or too easy; `specrl data check`).",
    ),
    Alert(
        "SpecrlWeightSyncFailures",
        f"sum by ({PER_RUN}, kind) (increase(specrl_weight_push_failures_total[10m])) > 0",
        "0m",
        "critical",
        f"{RUN_IN} {{{{ $labels.kind }}}} weight pushes to the rollout servers are failing.",
    ),
    Alert(
        "SpecrlSamplerSelfTestFailed",
        f"min by ({PER_RUN}, instance) (specrl_rollout_self_test_passed) == 0",
        "0m",
        "critical",
        f"{RUN_IN} Rollout server {{{{ $labels.instance }}}} failed its lossless sampler self-test.",
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
            {"refId": chr(ord("A") + j), "expr": scoped(expr), "legendFormat": legend, "range": True}
            for j, (expr, legend) in enumerate(p.queries)
        ],
    }


# The series every run has while it runs (the orchestrator's), for the variables' values.
RUN_SERIES = "specrl_policy_version"


def _run_variable(label: str, narrowed_by: tuple[str, ...]) -> dict[str, Any]:
    """A dashboard variable choosing one value of `label` among those of the runs Prometheus
    has, within the values already chosen for `narrowed_by`."""
    within = ",".join(f'{n}=~"${n}"' for n in narrowed_by)
    query = (
        f"label_values({RUN_SERIES}{{{within}}}, {label})"
        if within
        else f"label_values({RUN_SERIES}, {label})"
    )
    return {
        "name": label,
        "label": {"namespace": "Namespace", "release": "Run (Helm release)"}.get(label, label),
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{label}-values"},
        "definition": query,
        "refresh": 2,  # on time range change: runs come and go
        "sort": 1,
        "includeAll": False,
        "multi": False,
        "current": {},
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
                },
                *(_run_variable(label, RUN[:i]) for i, label in enumerate(RUN)),
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
    """(dashboard uid, panel title, PromQL) of every panel query as Grafana runs it, with
    every value of the run variables (namespace, release) chosen: what a Prometheus
    without those labels (one run, scraped directly) answers too."""
    every_run = ",".join(f'{label}=~".*"' for label in RUN)
    return [
        (d.uid, p.title, scoped(expr, every_run))
        for d in DASHBOARDS
        for p in d.panels
        for expr, _ in p.queries
    ]


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
