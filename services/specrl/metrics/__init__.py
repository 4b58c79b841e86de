"""Every specrl Prometheus metric, defined once, on one registry per process.

Names follow `specrl_<service>_<thing>_<unit>`; counters are raw (drafts, draft tokens,
accepted tokens, accepted per position) and ratios such as acceptance length are left to
PromQL, as vLLM does: `1 + rate(..._accepted_tokens_total) / rate(..._drafts_total)`.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

REGISTRY = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class RolloutMetrics:
    """The rollout-server's metrics (`specrl_rollout_*`)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = registry
        self.requests = Counter(
            "specrl_rollout_requests",
            "Generate calls by outcome: ok, error, invalid (refused input), cancelled (the caller "
            "went away: its deadline or a disconnect)",
            ["status"],
            registry=r,
        )
        self.samples = Counter("specrl_rollout_samples", "Samples returned", registry=r)
        self.prompt_tokens = Counter("specrl_rollout_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generated_tokens = Counter("specrl_rollout_generated_tokens", "Tokens generated", registry=r)
        self.latency = Histogram(
            "specrl_rollout_request_latency_seconds",
            "Wall time of a Generate call",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.drafts = Counter(
            "specrl_rollout_spec_drafts", "Verification steps with drafted tokens", registry=r
        )
        self.draft_tokens = Counter("specrl_rollout_spec_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted_tokens = Counter(
            "specrl_rollout_spec_accepted_tokens", "Draft tokens accepted", registry=r
        )
        self.accepted_per_position = Counter(
            "specrl_rollout_spec_accepted_tokens_per_position",
            "Draft tokens accepted at each draft position",
            ["position"],
            registry=r,
        )
        self.acceptance_length = Histogram(
            "specrl_rollout_acceptance_length",
            "Per-sample acceptance length (tokens per verification step)",
            buckets=(1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 8),
            registry=r,
        )
        self.queue_depth = Gauge(
            "specrl_rollout_engine_queue_depth",
            "Sequences submitted to the engine and not finished",
            registry=r,
        )
        self.self_test_passed = Gauge(
            "specrl_rollout_self_test_passed",
            "1 if the startup speculative-sampling self-test passed, 0 if it failed, -1 until "
            "it has run (or when it does not: disabled, no speculation)",
            registry=r,
        )
        self.self_test_passed.set(-1)  # 0 would read as a failure
        self.self_test_p_value = Gauge(
            "specrl_rollout_self_test_p_value",
            "p-value of the startup speculative-sampling self-test",
            registry=r,
        )
        self.policy_version = Gauge(
            "specrl_rollout_policy_version", "Policy weights version being served", registry=r
        )
        self.draft_version = Gauge(
            "specrl_rollout_draft_version", "Draft weights version being served", registry=r
        )
        self.speculative_tokens = Gauge(
            "specrl_rollout_num_speculative_tokens",
            "Configured draft length k (0 when speculation is off)",
            registry=r,
        )
        self.draft_policy_version = Gauge(
            "specrl_rollout_draft_policy_version",
            "Policy version the served draft was trained against",
            registry=r,
        )
        self.draft_lag = Gauge(
            "specrl_rollout_draft_lag_versions",
            "Policy versions between the served policy and the one the draft was trained against",
            registry=r,
        )
        self.stale_draft = Gauge(
            "specrl_rollout_stale_draft",
            "1 when the draft lags the policy by more than weight_sync.max_draft_lag versions",
            registry=r,
        )
        self.weights_ready = Gauge(
            "specrl_rollout_weights_ready",
            "1 when the served weights are complete and synced (Generate is served)",
            registry=r,
        )
        self.weight_sync_seconds = Histogram(
            "specrl_weight_sync_seconds",
            "Weight update time on a rollout server, Begin to Commit",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.weight_sync_bytes = Counter(
            "specrl_weight_sync_bytes", "Bytes of committed weight updates", ["kind"], registry=r
        )
        self.weight_sync_bandwidth = Gauge(
            "specrl_weight_sync_bandwidth_bytes_per_second",
            "Effective bandwidth of the last committed update (bytes / Begin-to-Commit time)",
            ["kind"],
            registry=r,
        )
        self.weight_updates = Counter(
            "specrl_weight_sync_updates",
            "Weight updates by outcome (committed, aborted, failed, rejected)",
            ["kind", "outcome"],
            registry=r,
        )
        self.adaptive_k = Gauge(
            "specrl_rollout_adaptive_k",
            "Draft length the adaptive controller has set for a range of engine batch sizes",
            ["batch_sizes"],
            registry=r,
        )
        self.drafter_paused = Gauge(
            "specrl_rollout_drafter_paused",
            "1 while k is 0 at every batch size and the engine skips the drafter altogether",
            registry=r,
        )
        self.history_rows = Counter(
            "specrl_rollout_history_rows",
            "Request steps the hybrid (speculation.history.hybrid) drafted from history or by "
            "the draft model (source), as the engine counts them: read after Generate calls "
            "(at most every 10 s) and at GetStatus",
            ["source"],
            registry=r,
        )
        self.history_extended_rows = Counter(
            "specrl_rollout_history_extended_rows",
            "Request steps whose draft-model draft the hybrid extended with history's tokens "
            "after it (speculation.history.hybrid_max_draft above the model's k), counted "
            "among the draft model's rows: read with specrl_rollout_history_rows",
            registry=r,
        )
        self.history_tokens = Gauge(
            "specrl_rollout_history_tokens",
            "Tokens the history drafter holds (its suffix trees over each prompt's responses), "
            "read with specrl_rollout_history_rows",
            registry=r,
        )
        self.adaptive_speedup = Gauge(
            "specrl_rollout_adaptive_speedup",
            "Generation speedup from speculation the adaptive controller estimates for a range "
            "of batch sizes: output rate at the draft length in force over the rate without "
            "speculation (1: running without drafts; under 1: the draft costs more than it saves)",
            ["batch_sizes"],
            registry=r,
        )
        self.adaptive_rate = Gauge(
            "specrl_rollout_adaptive_tokens_per_second",
            "Engine output rate the adaptive controller estimates at draft length k for a "
            "range of batch sizes (measured step cost, measured acceptance); k=off: with "
            "speculation off everywhere (the drafter paused)",
            ["batch_sizes", "k"],
            registry=r,
        )


class WeightSenderMetrics:
    """A weight publisher's metrics (`specrl_weight_push_*`; trainer and draft-trainer)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = registry
        self.seconds = Histogram(
            "specrl_weight_push_seconds",
            "Time to push one version to every member, Begin to Commit",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.bytes = Counter("specrl_weight_push_bytes", "Bytes broadcast", ["kind"], registry=r)
        self.bandwidth = Gauge(
            "specrl_weight_push_bandwidth_bytes_per_second",
            "Effective bandwidth of the last push",
            ["kind"],
            registry=r,
        )
        self.version = Gauge("specrl_weight_push_version", "Last version pushed", ["kind"], registry=r)
        self.members = Gauge(
            "specrl_weight_group_members", "Rollout servers in the weight group", ["kind"], registry=r
        )
        self.epoch = Gauge(
            "specrl_weight_group_epoch", "Current formation of the group", ["kind"], registry=r
        )
        self.failures = Counter(
            "specrl_weight_push_failures",
            "Failed push attempts (a member dropped, group re-formed)",
            ["kind"],
            registry=r,
        )


class TrainerMetrics:
    """The trainer's metrics (`specrl_trainer_*`), exported by rank 0."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = registry
        self.stage_seconds = Histogram(
            "specrl_trainer_stage_seconds",
            "Time per trainer stage of a step (logprob: old/ref logprobs and capture; train)",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.steps = Counter("specrl_trainer_steps", "Optimizer steps taken", registry=r)
        self.tokens = Counter("specrl_trainer_tokens", "Completion tokens trained on", registry=r)
        self.tokens_per_second = Gauge(
            "specrl_trainer_tokens_per_second", "Completion tokens per second of the last step", registry=r
        )
        self.step_value = Gauge(
            "specrl_trainer_step_value",
            "Last step's value of each training statistic",
            # the names StepMetrics.stats carries (specrl.trainer.step): loss, entropy,
            # grad_norm and the loss's own (GRPO: pg_loss, kl, clip_fraction, is_weight)
            ["stat"],
            registry=r,
        )
        self.mismatch_kl = Gauge(
            "specrl_trainer_logprob_mismatch_kl",
            "mean(rollout - trainer) logprob over the last batch's completion tokens",
            registry=r,
        )
        self.mismatch_max_abs = Gauge(
            "specrl_trainer_logprob_mismatch_max_abs",
            "max |rollout - trainer| logprob over the last batch's completion tokens",
            registry=r,
        )
        self.capture_queue = Gauge(
            "specrl_trainer_capture_queue_size", "Captured batches waiting for the draft-trainer", registry=r
        )
        self.capture_dropped = Gauge(
            "specrl_trainer_capture_dropped",
            "Captured batches dropped because the queue was full",
            registry=r,
        )


class DraftMetrics:
    """The draft-trainer's metrics (`specrl_draft_*`). Its held-out estimate of the
    acceptance length sits next to the one the rollout servers measure
    (`specrl_rollout_spec_*`, `specrl_step_acceptance_length`)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = registry
        self.steps = Counter("specrl_draft_steps", "Draft optimizer steps taken", registry=r)
        self.tokens = Counter("specrl_draft_tokens", "Captured tokens the draft trained on", registry=r)
        self.refused = Counter(
            "specrl_draft_refused_batches", "Captured batches refused (bad shape, NaN, ...)", registry=r
        )
        self.loss = Gauge("specrl_draft_loss", "Training-time-test loss of the last step", registry=r)
        self.agreement = Gauge(
            "specrl_draft_heldout_agreement",
            "Held-out top-1 agreement with the target per draft position",
            ["position"],
            registry=r,
        )
        self.acceptance_estimate = Gauge(
            "specrl_draft_acceptance_length_estimate",
            "Acceptance length implied by the held-out agreement of the draft last evaluated",
            registry=r,
        )
        self.policy_version = Gauge(
            "specrl_draft_policy_version", "Newest policy version the draft trained against", registry=r
        )
        self.published_version = Gauge(
            "specrl_draft_published_version", "Draft version last published", registry=r
        )
        self.held_back = Counter(
            "specrl_draft_held_back", "Due publishes held back (draft judged worse)", registry=r
        )


STAGES = ("data", "prepare", "gen", "exposed_generation", "reward", "logprob", "train", "checkpoint", "other")


class OrchestratorMetrics:
    """The RL loop's metrics (`specrl_step_*`, `specrl_policy_*`, queues, idle time)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        r = registry
        self.stage_seconds = Histogram(
            "specrl_step_stage_seconds",
            "Time of each stage of an RL step (gen spans a batch's generation; in async RL it "
            "overlaps training, exposed_generation is the part the trainer waited for)",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.step_seconds = Histogram(
            "specrl_step_seconds", "Wall time of an RL step", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.exposed_generation = Histogram(
            "specrl_exposed_generation_seconds",
            "Time the trainer waited for rollouts in a step",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # The last step's values, held until the next step ends: what the dashboards show.
        # A histogram is observed once a step, so a rate over a minute or two of it is 0/0
        # between two steps minutes apart; these read right at any step length.
        self.last_stage_seconds = Gauge(
            "specrl_last_step_stage_seconds",
            "Time of each stage of the last RL step (stages as specrl_step_stage_seconds)",
            ["stage"],
            registry=r,
        )
        self.last_step_seconds = Gauge(
            "specrl_last_step_seconds", "Wall time of the last RL step", registry=r
        )
        self.last_exposed_share = Gauge(
            "specrl_last_step_exposed_generation_share",
            "Exposed generation over wall time of the last RL step",
            registry=r,
        )
        self.last_idle_share = Gauge(
            "specrl_last_step_idle_share",
            "Share of the last RL step's wall time a role had no work (as specrl_role_idle_seconds)",
            ["role"],
            registry=r,
        )
        self.policy_lag = Histogram(
            "specrl_policy_lag",
            "Per-sample policy lag: trainer policy version when trained on minus the generating version",
            buckets=(0, 1, 2, 3, 4, 8, 16),
            registry=r,
        )
        self.policy_version = Gauge("specrl_policy_version", "Policy version of the trainer", registry=r)
        self.steps = Counter("specrl_steps", "RL steps completed", registry=r)
        self.samples = Counter(
            "specrl_samples",
            "Samples by outcome (trained, stale: dropped beyond the lag bound, duplicate)",
            ["outcome"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "specrl_queue_depth", "Groups waiting or in progress per queue", ["queue"], registry=r
        )
        self.generation_in_flight = Gauge(
            "specrl_generation_in_flight",
            "Generate calls (prompt groups) in flight per rollout replica; the sequences in flight "
            "on it are sampling.n times this (fewer as a group's samples finish)",
            ["replica"],
            registry=r,
        )
        self.generation_slots = Gauge(
            "specrl_generation_slots",
            "Generate calls a replica may have in flight: orchestrator.concurrency, or "
            "ceil(1.25 x the max_num_seqs its engine reports / sampling.n)",
            ["replica"],
            registry=r,
        )
        self.replica_tokens_per_second = Gauge(
            "specrl_rollout_replica_tokens_per_second",
            "Tokens a rollout replica's engine generated per second, over every request it "
            "served, between the orchestrator's last two reads of its status (its load)",
            ["replica"],
            registry=r,
        )
        self.generation_queue_wait = Histogram(
            "specrl_generation_queue_wait_seconds",
            "Time a prompt group waited from its admission to the prompt queue (or its re-queue "
            "after a failed call) until its Generate call started, by the replica that took it",
            ["replica"],
            buckets=(*_LATENCY_BUCKETS, 600, 1800),
            registry=r,
        )
        self.history_carried_tokens = Counter(
            "specrl_generation_history_carried_tokens_total",
            "Tokens of earlier responses the orchestrator sent to rollout replicas that had not "
            "seen their prompt since they started (history drafting, orchestrator.history_carry_tokens)",
            registry=r,
        )
        self.generation_demand = Gauge(
            "specrl_generation_demand_sequences",
            "Sequences the run wants generated now: samples per group x prompt groups admitted "
            "and not yet generated (in flight or waiting); autoscaling divides it by a replica's "
            "engine.max_num_seqs",
            registry=r,
        )
        self.replicas = Gauge(
            "specrl_rollout_replicas",
            "Rollout replicas the loop generates on (elastic with rollout.discover)",
            registry=r,
        )
        self.target_replicas = Gauge(
            "specrl_rollout_target_replicas",
            "Rollout replicas the orchestrator's autoscaler asked for last (rollout.autoscale)",
            registry=r,
        )
        self.autoscale_decisions = Counter(
            "specrl_rollout_autoscale_decisions",
            "Scale changes the orchestrator's autoscaler made, by direction (up, down)",
            ["direction"],
            registry=r,
        )
        self.predicted_exposed_share = Gauge(
            "specrl_rollout_autoscale_predicted_exposed_share",
            "Exposed generation share the autoscaler predicts at the replicas it asked for",
            registry=r,
        )
        self.reward = Gauge("specrl_step_reward_mean", "Mean reward of the last step's samples", registry=r)
        self.zero_variance_groups = Gauge(
            "specrl_step_zero_variance_groups_ratio",
            "Share of the last step's groups whose samples all got the same reward (GRPO learns "
            "nothing from them)",
            registry=r,
        )
        self.no_signal_steps = Gauge(
            "specrl_steps_without_signal",
            "Consecutive steps, up to the last, in which every group had zero reward variance",
            registry=r,
        )
        self.acceptance_length = Gauge(
            "specrl_step_acceptance_length",
            "Tokens per target verification step over the last step's samples (1 without speculation)",
            registry=r,
        )
        self.idle_seconds = Counter(
            "specrl_role_idle_seconds",
            "Time a role had no work: trainer (waiting for rollouts or weights), "
            "rollout (no request in flight)",
            ["role"],
            registry=r,
        )
        self.replica_idle_seconds = Counter(
            "specrl_rollout_replica_idle_seconds",
            "Time a rollout replica had no Generate call of the run in flight (one idle replica "
            "among many does not show in specrl_role_idle_seconds{role=rollout})",
            ["replica"],
            registry=r,
        )
        self.generation_retries = Counter(
            "specrl_generation_retries", "Prompt groups given back after a failed Generate call", registry=r
        )
        self.generation_stalled = Counter(
            "specrl_generation_stalled",
            "Times a rollout replica was found generating no token for orchestrator.generate_stall_s "
            "with calls in flight (its calls cancelled, their groups sent elsewhere)",
            registry=r,
        )
        self.generation_dropped = Counter(
            "specrl_generation_dropped",
            "Prompt groups dropped after orchestrator.max_attempts failed Generate calls",
            registry=r,
        )
        self.data_skipped = Gauge(
            "specrl_data_skipped_rows", "Dataset rows skipped so far, by reason", ["reason"], registry=r
        )


def serve(port: int, registry: CollectorRegistry = REGISTRY) -> int:
    """Expose /metrics on `port` (0 picks one); returns the bound port."""
    server, _ = start_http_server(port, addr="0.0.0.0", registry=registry)
    return server.server_port
