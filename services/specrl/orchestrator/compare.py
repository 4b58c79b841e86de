"""Comparison runs (`compare.runs`): the main run's job again with one thing changed, so
the report can put speculation beside AR, asynchronous beside synchronous RL and the
hybrid with history beside the draft model alone on the same machine, in the same
command, from the same weights, seeds and prompts."""

from __future__ import annotations

import json

from specrl.config import CompareRun, RunConfig
from specrl.speculation import HISTORY_DRAFT


def comparison(cfg: RunConfig, run: CompareRun) -> RunConfig:
    """The main run's config changed into comparison `run`, for `compare.steps` steps,
    with its run directory under the main one's (compare/<run>)."""
    c = json.loads(cfg.model_dump_json())
    c["name"] = f"{cfg.name}-{run}"
    c["output_dir"] = str(cfg.run_dir / "compare" / run)
    c["compare"] = {"runs": []}
    # the main run has shown its ports and passed its self-test (same engine and sampler)
    c["orchestrator"] |= {"steps": cfg.compare.steps, "metrics_port": None, "status_port": None}
    c["rollout"]["server"]["self_test"]["enabled"] = False
    c["draft_trainer"]["server"]["save_dir"] = None  # its drafts under its own run directory
    if run == "ar":
        c["rollout"]["server"]["speculation"] = {"method": "none"}
        c["draft_trainer"]["enabled"] = False  # nothing to adapt, nothing to capture for
        c["trainer"]["server"]["trainer"]["capture"]["enabled"] = False
    elif run == "hybrid":
        spec = c["rollout"]["server"]["speculation"]
        spec["history"]["hybrid"] = True
        # history's drafts past the draft model's k, as `bench history` measures the
        # hybrid (the adaptive controller's k covers both sources: not with it)
        if spec["history"]["hybrid_max_draft"] is None and not spec["adaptive"]["enabled"]:
            spec["history"]["hybrid_max_draft"] = max(HISTORY_DRAFT, spec["num_speculative_tokens"])
    else:
        c["orchestrator"]["max_lag"] = 1
    return RunConfig.model_validate(c)


def describe(cfg: RunConfig) -> str:
    """A run's label in reports: its speculation and policy lag, e.g. `eagle3 k=3, lag 0`."""
    spec = cfg.rollout.server.speculation
    if cfg.rollout.elsewhere:
        how = "rollouts elsewhere"
    elif spec.method == "none":
        how = "AR"
    else:
        k = (
            f"adaptive k<={spec.num_speculative_tokens}"
            if spec.adaptive.enabled
            else f"k={spec.num_speculative_tokens}"
        )
        how = f"{spec.method}{'+history' if spec.history.hybrid else ''} {k}"
    return f"{how}, lag {cfg.orchestrator.max_lag}"
