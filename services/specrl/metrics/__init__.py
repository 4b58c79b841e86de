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
            "specrl_rollout_requests", "Generate calls by outcome", ["status"], registry=r
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
            "1 if the startup speculative-sampling self-test passed, 0 if it failed",
            registry=r,
        )
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


def serve(port: int, registry: CollectorRegistry = REGISTRY) -> int:
    """Expose /metrics on `port` (0 picks one); returns the bound port."""
    server, _ = start_http_server(port, addr="0.0.0.0", registry=registry)
    return server.server_port
