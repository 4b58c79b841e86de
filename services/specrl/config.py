"""Typed configuration of every specrl service, validated once at load.

Torch-free on purpose: `specrl --help` and config validation must be instant. YAML files
map one-to-one onto these models; unknown keys are errors (a misspelled option must never
be silently ignored), and a validation error names the offending field.
"""

from __future__ import annotations

import importlib.util
import os
import pkgutil
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from specrl.speculation import MAX_SPECULATIVE_TOKENS, Method, has_draft_model

ZOO_SCHEME = "zoo:"
# Completion tokens per sample in RL runs and draft init unless a config says otherwise
# (the rollout server's own default, for bare requests, is the engines' DEFAULT_MAX_TOKENS).
MAX_COMPLETION_TOKENS = 48


def specrl_home() -> Path:
    """Where specrl caches the model zoo and other artifacts: $SPECRL_HOME, else
    ~/.cache/specrl."""
    return Path(os.environ.get("SPECRL_HOME", Path.home() / ".cache" / "specrl")).expanduser()


def resolve_model_path(ref: str) -> str:
    """`zoo:NAME` -> the zoo's directory for NAME; anything else (a local path or a hub id
    such as Qwen/Qwen3-8B on a cluster) is returned unchanged."""
    if ref.startswith(ZOO_SCHEME):
        return str(specrl_home() / "zoo" / ref[len(ZOO_SCHEME) :])
    return ref


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdaptiveSpeculationConfig(StrictModel):
    """The adaptive draft-length controller (rollout/adaptive.py): k per engine batch size,
    0 included, chosen from the engine's measured step costs and acceptance."""

    enabled: bool = False
    # engine decode steps measured at one k in one batch range before its rate is trusted
    min_samples: int = Field(8, ge=2)
    # most recent steps kept per (batch range, k)
    window: int = Field(32, ge=2)
    # speculating steps between probes of the paused engine (the first after a quarter),
    # and the length of an off period
    refresh_steps: int = Field(1000, ge=10)
    # a batch range re-measures the ks it does not run (its anchors) every this many
    # refresh_steps of its own steps
    renew_periods: int = Field(4, ge=1, le=1024)
    # a k replaces the one in force only when measured this much faster
    min_gain: float = Field(1.03, ge=1.0, le=2.0)
    # the runner-up (the measured k, 0 included, rated next after the k in force) is
    # measured again, next in time to the k in force, when its measurement is this many
    # of the range's steps old and its rate within recheck_margin of the k in force: one
    # measurement taken minutes earlier (the engine warming up, a busy neighbour on the
    # node) otherwise decides between close ks until the anchors are renewed
    recheck_steps: int = Field(256, ge=1)
    recheck_margin: float = Field(1.2, ge=1.0, le=3.0)
    # speculation is kept only when estimated this much faster than AR (a wash goes to
    # AR): the estimate is the engine's own cycle time, which does not see everything
    # (per-request and frontend work; docs/draft.md)
    ar_margin: float = Field(1.10, ge=1.0, le=3.0)
    # speculation already on stays on at a probe when estimated this much faster than the
    # paused engine (at most ar_margin, which turning it back on takes): a draft near
    # ar_margin is not turned off by one probe's noise (the probe compares two engines
    # by the same cycle time, not biased between them: docs/draft.md)
    keep_margin: float = Field(1.05, ge=1.0, le=3.0)
    # acceptance per draft position is estimated over this many recent drafts there: many
    # requests, since acceptance differs from prompt to prompt and a short window chases
    # it (docs/draft.md)
    acceptance_window: int = Field(4096, ge=8)
    # drafts verified at the last position, by any batch range, before a range leaves its
    # largest-k anchor (for at most refresh_steps / 8 steps); and at the second position
    # before speculation measured afresh from its cheap end is judged
    deep_drafts: int = Field(64, ge=1)
    cheap_drafts: int = Field(32, ge=1)
    # each consecutive decision for off (speculation measured afresh and losing again)
    # doubles the next off period, up to this many refresh periods
    off_backoff_max: int = Field(8, ge=1, le=1024)

    @model_validator(mode="after")
    def _check(self) -> AdaptiveSpeculationConfig:
        if self.window < self.min_samples:
            raise ValueError("speculation.adaptive.window must be >= min_samples")
        if self.keep_margin > self.ar_margin:
            raise ValueError("speculation.adaptive.keep_margin must be <= ar_margin")
        return self


class HistoryConfig(StrictModel):
    """The history drafter (method history: specrl.rollout.history): drafts continue the
    request's last tokens where they occurred in its prompt, its sibling samples and
    earlier responses to the same prompt on this replica."""

    min_match: int = Field(2, ge=1)  # tokens a match needs at least
    # tokens the suffix trees hold per suffix: a match and its draft span at most this
    max_depth: int = Field(16, ge=2, le=64)
    # a draft token's estimated probability (the product of the branch shares that lead
    # to it) must be at least this (vLLM's suffix_decoding_min_token_prob)
    min_token_prob: float = Field(0.1, gt=0, le=1)
    # a match of m tokens drafts at most max_spec_factor * m tokens (vLLM's
    # suffix_decoding_max_spec_factor)
    max_spec_factor: float = Field(1.0, gt=0)
    max_sequences_per_prompt: int = Field(64, ge=1)
    max_prompts: int = Field(4096, ge=1)
    # tokens kept over every prompt (~400 bytes each in the native suffix trees)
    max_tokens: int = Field(4_000_000, ge=1)
    max_age: int = Field(8, ge=0)  # policy updates a response is kept across
    # With a draft model (method eagle3 or draft_model): each request's draft comes from
    # history or the draft model, whichever's drafts agreed more with what the policy
    # sampled on that request lately (both are scored every step, verified or not:
    # rollout/hybrid.py). History's draft is a candidate where the request's last
    # `hybrid_min_match` tokens at least agree with history's and it drafts
    # `hybrid_min_draft` tokens at least. When history's drafts alone (none for a request
    # without one) are expected to give an engine step more tokens per second (measured
    # step times), the draft model runs its first pass only, over the rows that do not take
    # history's draft (and new requests' prompts): none where every row takes it
    # (rollout/engines/vllm/history.py).
    hybrid: bool = False
    hybrid_min_draft: int = Field(2, ge=1)
    hybrid_min_match: int = Field(2, ge=1)
    # The longest draft history gives in the hybrid, past the draft model's
    # num_speculative_tokens: the engine is built for this many draft tokens and the draft
    # model still drafts num_speculative_tokens, so a request whose history repeats drafts
    # further than the model's sequential positions would pay for (None: the model's k).
    hybrid_max_draft: int | None = Field(None, ge=1, le=MAX_SPECULATIVE_TOKENS)
    # With hybrid_max_draft: the draft model's full draft goes on with history's tokens
    # after it, as far as they are expected to pay (an extension). Pays on long traces
    # where history alone does not beat the draft model (RL-Think on the CPU testbed, c=4:
    # 1.29x EAGLE-3 alone from the second epoch); off by default because where extensions
    # add little they keep a replica off vLLM's padded path (RL-Zero's first epoch, c=16:
    # 0.85x EAGLE-3 alone; docs/draft.md).
    hybrid_extend: bool = False
    # Engine steps in a row a request takes history's draft before it is left out of the
    # draft model's passes (EAGLE-3 only), for as long as history keeps drafting it: the
    # draft model's work runs over the other requests only (0: never leave one out).
    hybrid_leave_out_after: int = Field(2, ge=0)
    # Where under this share of a kind of request's rows took history's draft, or had a
    # token of an extension accepted, lately (a first epoch, new prompts; fresh requests and
    # those whose prompt has finished responses are judged apart) new requests of that kind
    # are looked up only every few steps, and steps in which no row did, every row's kind
    # idle, run on vLLM's padded drafter path, the draft model alone (rollout/hybrid.py
    # ByKind, TakenShare; 0: never, 1: whenever nothing was taken).
    hybrid_idle_share: float = Field(0.1, ge=0, le=1)

    @model_validator(mode="after")
    def _check(self) -> HistoryConfig:
        if self.min_match >= self.max_depth:
            raise ValueError("speculation.history.min_match must be < max_depth (a match and its draft)")
        if self.hybrid_min_match >= self.max_depth:
            raise ValueError(
                "speculation.history.hybrid_min_match must be < max_depth (a match and its draft)"
            )
        return self

    def index_settings(self) -> dict:
        """The settings of the index itself (specrl.rollout.history.HistoryIndex)."""
        hybrid = {
            "hybrid",
            "hybrid_min_draft",
            "hybrid_min_match",
            "hybrid_max_draft",
            "hybrid_leave_out_after",
            "hybrid_idle_share",
            "hybrid_extend",
        }
        return self.model_dump(exclude=hybrid)


class SpeculationConfig(StrictModel):
    """Which speculative decoding the engine runs. `draft` is a model reference (path or
    zoo:NAME) for eagle3 and draft_model, and must be absent otherwise."""

    method: Method = "none"
    num_speculative_tokens: int = Field(3, ge=1, le=MAX_SPECULATIVE_TOKENS)
    draft: str | None = None
    # n-gram lookup window over the prompt + output so far (method ngram only).
    prompt_lookup_min: int = Field(2, ge=1)
    prompt_lookup_max: int = Field(5, ge=1)
    # Draft length by engine batch size (vLLM's dynamic speculative decoding): entries
    # (first batch size, last batch size, k), inclusive, the first starting at 1, each k
    # at most num_speculative_tokens (the maximum the engine is built for); 0 turns
    # speculation off for that range (e.g. at high concurrency, where verifying drafts
    # costs more than it saves). None: num_speculative_tokens at every batch size.
    k_schedule: tuple[tuple[int, int, int], ...] | None = None
    # k chosen per batch size by the server from measurements (k_schedule, if given, is
    # where it starts; num_speculative_tokens is the largest k it tries)
    adaptive: AdaptiveSpeculationConfig = AdaptiveSpeculationConfig()
    # method history, or hybrid with a draft model (history.hybrid)
    history: HistoryConfig = HistoryConfig()

    @model_validator(mode="after")
    def _check(self) -> SpeculationConfig:
        needs_draft = has_draft_model(self.method)
        if needs_draft and not self.draft:
            raise ValueError(f"speculation.draft is required for method {self.method!r}")
        if not needs_draft and self.draft:
            raise ValueError(f"speculation.draft has no effect with method {self.method!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("speculation.prompt_lookup_min must be <= prompt_lookup_max")
        if self.k_schedule is not None:
            self._check_schedule(self.k_schedule)
        if self.adaptive.enabled and not self.enabled:
            raise ValueError("speculation.adaptive needs a speculation method")
        if self.history.hybrid and not needs_draft:
            raise ValueError(
                f"speculation.history.hybrid needs a draft model (method eagle3 or draft_model), "
                f"not method {self.method!r}"
            )
        if self.history.hybrid_max_draft is not None:
            self._check_hybrid_max_draft(self.history.hybrid_max_draft)
        if self.history.hybrid_extend and (self.history.hybrid_max_draft or 0) <= self.num_speculative_tokens:
            raise ValueError(
                "speculation.history.hybrid_extend needs hybrid_max_draft above "
                f"num_speculative_tokens={self.num_speculative_tokens}: the room history's "
                "tokens after the draft model's take"
            )
        return self

    def _check_hybrid_max_draft(self, longest: int) -> None:
        if not self.history.hybrid:
            raise ValueError("speculation.history.hybrid_max_draft needs speculation.history.hybrid")
        if longest < self.num_speculative_tokens:
            raise ValueError(
                f"speculation.history.hybrid_max_draft={longest} is below num_speculative_tokens="
                f"{self.num_speculative_tokens}: history drafts at least as far as the draft model"
            )
        if longest > self.num_speculative_tokens and self.adaptive.enabled:
            raise ValueError(
                "speculation.adaptive cannot run with history.hybrid_max_draft above "
                "num_speculative_tokens: the controller measures and chooses one draft length "
                "for both sources; leave hybrid_max_draft unset, or adaptive off"
            )

    def _check_schedule(self, schedule: tuple[tuple[int, int, int], ...]) -> None:
        if not self.enabled:
            raise ValueError("speculation.k_schedule needs a speculation method")
        previous = 0
        for first, last, k in schedule:
            if first != previous + 1 or last < first:
                raise ValueError(
                    f"speculation.k_schedule: ranges must start at batch size 1 and follow each "
                    f"other without gaps or overlaps; got ({first}, {last}) after {previous}"
                )
            if not 0 <= k <= self.num_speculative_tokens:
                raise ValueError(
                    f"speculation.k_schedule: k={k} outside [0, num_speculative_tokens="
                    f"{self.num_speculative_tokens}]"
                )
            previous = last

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def drafts_from_history(self) -> bool:
        """The engine drafts from the run's history: method history, or hybrid."""
        return self.method == "history" or self.history.hybrid

    @property
    def k(self) -> int:
        """Draft length actually in force (0 when speculation is off)."""
        return self.num_speculative_tokens if self.enabled else 0

    @property
    def engine_k(self) -> int:
        """The longest draft the engine is built for: the draft model's k, or history's
        longest in the hybrid (history.hybrid_max_draft)."""
        return max(self.k, self.history.hybrid_max_draft or 0) if self.history.hybrid else self.k


class BaseEngineConfig(StrictModel):
    """What every generation engine is told: the target model it serves, its limits, and
    how one replica spans GPUs and machines. Each engine's config adds its own."""

    kind: str  # which engine: each engine's config narrows it to its own name
    model: str = "zoo:target"
    max_model_len: int = Field(512, ge=16)
    # most sequences in one engine step (the adaptive controller's largest batch size)
    max_num_seqs: int = Field(128, ge=1)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    seed: int = 0
    tensor_parallel_size: int = Field(1, ge=1)
    # One replica across several machines (pods; a LeaderWorkerSet in deploy/helm): the
    # engine's multi-node executor with the tensor-parallel ranks split evenly over
    # `nnodes`. Node 0 is `specrl serve rollout`, every other node `specrl serve
    # rollout-worker --node-rank N`, all with this config. `master_addr` is node 0's
    # address (None: $LWS_LEADER_ADDRESS, which a LeaderWorkerSet sets, else this
    # machine); `master_port` the engine's rendezvous port on it.
    nnodes: int = Field(1, ge=1)
    master_addr: str | None = None
    master_port: int = Field(29600, ge=1, le=65535)
    # Node N > 0 stops its workers once node 0, having served, has not answered for this
    # long (a LeaderWorkerSet recreates the whole group anyway; on a plain machine the
    # worker process must end by itself).
    leader_grace_s: float = Field(30.0, gt=0)

    @model_validator(mode="after")
    def _nodes(self) -> BaseEngineConfig:
        if self.tensor_parallel_size % self.nnodes:
            raise ValueError(
                f"tensor_parallel_size ({self.tensor_parallel_size}) must split evenly over nnodes "
                f"({self.nnodes})"
            )
        return self

    @property
    def leader(self) -> str:
        """Node 0's address for the engine's rendezvous."""
        return self.master_addr or os.environ.get("LWS_LEADER_ADDRESS") or "127.0.0.1"


class VllmEngineConfig(BaseEngineConfig):
    """vLLM (rollout/engines/vllm/) and its own options."""

    kind: Literal["vllm"] = "vllm"
    # tokens one engine step processes, prompt chunks included: a longer prefill (one long
    # prompt, many prompts at once) is split over steps; smaller keeps decode steps short
    # while prompts arrive. None: vLLM's default (2048 on CPU); at least max_num_seqs
    max_num_batched_tokens: int | None = Field(None, ge=1)
    # KV cache size in GiB; None sizes it by gpu_memory_utilization instead (on CPU that
    # is a fraction of the node's RAM, which fails when several engines share a machine).
    kv_cache_gib: float | None = Field(1.0, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    # CPU engines only (vLLM's VLLM_CPU_OMP_THREADS_BIND): "auto" binds the engine's
    # compute threads to the first free cores, which is core 0 for *every* engine on the
    # machine, so engines sharing a machine must be given distinct cores, e.g. "1" or
    # "2-3" ("|" separates tensor-parallel ranks); "nobind" leaves placement to the OS.
    cpu_threads_bind: str = Field("auto", pattern=r"^(auto|nobind|[0-9,\-|]+)$")

    @model_validator(mode="after")
    def _step_budget(self) -> VllmEngineConfig:
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}): every sequence in a step takes a token"
            )
        return self


def _engine_kind(value: object) -> object:
    """The `kind` of an engine config, vLLM's where it has none: every config written
    before there was a second engine to choose means vLLM."""
    if isinstance(value, dict):
        return value.get("kind", "vllm")
    return getattr(value, "kind", None)


# The generation engine and the target model it serves, by `kind` (rollout/engines/: one
# subpackage and one config class per engine). Another engine joins the union as
# `| Annotated[<Kind>EngineConfig, Tag("<kind>")]`.
EngineConfig = Annotated[Annotated[VllmEngineConfig, Tag("vllm")], Discriminator(_engine_kind)]


class SelfTestConfig(StrictModel):
    """Startup statistical self-test of the engine's speculative sampler."""

    enabled: bool = True
    # Rejection threshold of the chi-square test; a correct sampler fails with this
    # probability, a broken one passes with negligible probability (see docs/lossless.md).
    alpha: float = Field(1e-4, gt=0, lt=0.5)
    trials: int = Field(20000, ge=1000)
    seed: int = 1234


WeightKind = Literal["policy", "draft"]


class WeightReceiverConfig(StrictModel):
    """How a rollout server takes weight updates (see docs/weightsync.md)."""

    # Kinds that must be synced once before Generate is served: a replica added to a
    # running system waits here until the senders caught it up.
    await_kinds: tuple[WeightKind, ...] = ()
    # Begin waits this long for in-flight requests to finish on the old weights.
    drain_timeout_s: float = Field(300.0, gt=0)
    # Commit waits this long for the broadcast to land in the engine.
    receive_timeout_s: float = Field(300.0, gt=0)
    # Stale-draft alarm: the draft was trained against a policy more than this many
    # versions older than the one being served.
    max_draft_lag: int = Field(2, ge=0)


class WeightSenderConfig(StrictModel):
    """A publisher of policy (trainer) or draft (draft-trainer) weights."""

    kind: WeightKind = "policy"
    # Address the receivers reach this process's rendezvous store at.
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)  # 0 picks a free port
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl with CUDA, else gloo
    # Smaller buckets pipeline better (the receiver loads bucket i while bucket i+1 is on
    # the wire).
    bucket_mb: float = Field(64.0, gt=0)
    # Cast floating tensors to this dtype before sending (None: as they are).
    send_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    # Collective timeout: a receiver that stops taking part is noticed within this.
    timeout_s: float = Field(60.0, gt=0)
    rpc_timeout_s: float = Field(30.0, gt=0)
    # Full re-sends after a failed push (dead members dropped, group re-formed).
    retries: int = Field(1, ge=0)


class RolloutServerConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535)  # 0 picks a free port
    metrics_port: int | None = Field(None, ge=0, le=65535)
    engine: EngineConfig = VllmEngineConfig()
    speculation: SpeculationConfig = SpeculationConfig()
    self_test: SelfTestConfig = SelfTestConfig()
    # Versions reported with every sample until weight sync updates them.
    policy_version: int = Field(0, ge=0)
    draft_version: int = Field(0, ge=0)
    # Upper bound on prompts x n in one Generate call (protects the server).
    max_samples_per_request: int = Field(65536, ge=1)
    weight_sync: WeightReceiverConfig = WeightReceiverConfig()

    def node0_port_error(self) -> str | None:
        """Why a node of a multi-node replica started on its own (`specrl serve rollout` or
        `rollout-worker`, a LeaderWorkerSet's pods) cannot find node 0; None if it can.
        (Under `specrl run` with launcher ray the launcher picks node 0's port and tells
        every node.)"""
        if self.engine.nnodes > 1 and self.port == 0:
            return "engine.nnodes > 1 needs a fixed port: the other nodes watch node 0's gRPC health there"
        return None


class GRPOConfig(StrictModel):
    """The GRPO objective (DAPO-style asymmetric clipping, token-level aggregation)."""

    eps_low: float = Field(0.2, ge=0, lt=1)
    eps_high: float = Field(0.28, ge=0)
    # KL(policy || reference) penalty, k3 estimator; 0 disables it (no reference pass).
    kl_coef: float = Field(0.0, ge=0)
    # Divide group-centred rewards by the group's std (GRPO); False: centre only (Dr. GRPO).
    normalize_std: bool = True
    # Optimizer steps per batch, each over the whole batch against the behaviour policy's
    # logprobs (computed once): PPO epochs. The clip bounds how far they move the policy;
    # more epochs take more from each (expensive) batch of rollouts.
    epochs: int = Field(1, ge=1)
    # Truncated importance sampling against the rollout engine's logprobs (samples from
    # a lagged policy, or engine/trainer numerics): weight min(pi_old / pi_rollout, cap).
    # None disables it.
    is_cap: float | None = Field(None, gt=0)


class OptimConfig(StrictModel):
    lr: float = Field(1e-5, gt=0)
    # Linear warmup of the learning rate over the first steps: Adam's first updates are
    # ~lr * sign(gradient) for every weight, which on small, noisy RL batches is mostly
    # noise (docs/trainer.md, "Learning dynamics").
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float | None = Field(1.0, gt=0)


class CaptureConfig(StrictModel):
    """Verifier hidden states for the draft-trainer, taken during the logprob pass."""

    enabled: bool = False
    # EAGLE-3 aux layer ids; None: the default for the target's depth (must equal the
    # draft config's and the engine's, see specrl.features).
    aux_layer_ids: tuple[int, ...] | None = None
    # Share of completion tokens that carry a draft-training signal (the rest still give
    # context to the head's attention).
    token_fraction: float = Field(1.0, gt=0, le=1)
    # Keep the target's top-k logprobs per position; None keeps the full distribution.
    topk: int | None = Field(None, ge=1)
    # Captured batches held for the draft-trainer; when full the oldest is dropped (the
    # policy never waits for the draft).
    queue_size: int = Field(16, ge=1)


class DraftTrainingConfig(StrictModel):
    """Online EAGLE-3 adaptation on the verifier's captured hidden states."""

    lr: float = Field(3e-4, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    # Training-time-test steps (draft positions trained per base position) and the
    # loss weight decay**j of step j.
    ttt_steps: int = Field(3, ge=1)
    loss_decay: float = Field(0.8, gt=0, le=1)
    # Every this-many-th captured batch is held out (not trained on) to estimate the
    # draft's top-1 agreement and acceptance length; the newest `holdout_batches` kept.
    holdout_every: int = Field(10, ge=2)
    holdout_batches: int = Field(8, ge=1)


def loss_module(name: str) -> str:
    """The module that defines `trainer.loss` NAME: specrl.trainer.losses.NAME for a plain
    name, the module path itself for a dotted one (a loss kept outside specrl)."""
    return name if "." in name else f"specrl.trainer.losses.{name}"


class TrainerConfig(StrictModel):
    """The policy trainer (one process per rank; torchrun-compatible env vars)."""

    model: str = "zoo:target"
    dtype: Literal["float32", "bfloat16"] = "float32"
    tp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    micro_batch_size: int = Field(8, ge=1)
    seed: int = 0
    # The policy-gradient objective: one module per loss (docs/trainer.md, "Losses").
    # `grpo`; a dotted module path selects a loss defined outside specrl. Its
    # hyperparameters are `grpo`'s.
    loss: str = "grpo"
    grpo: GRPOConfig = GRPOConfig()
    optim: OptimConfig = OptimConfig()
    capture: CaptureConfig = CaptureConfig()

    @field_validator("loss")
    @classmethod
    def _loss_exists(cls, name: str) -> str:
        """Looked up without importing it (the loss needs torch; this config must not)."""
        try:
            found = importlib.util.find_spec(loss_module(name)) is not None
        except (ModuleNotFoundError, ValueError):  # a dotted name whose package is missing
            found = False
        if not found:
            package = importlib.util.find_spec("specrl.trainer.losses")
            names = sorted(m.name for m in pkgutil.iter_modules(package.submodule_search_locations))
            raise ValueError(f"no loss {name!r}: built-in losses are {names}, or give a module path")
        return name


class TrainerServerConfig(StrictModel):
    """`specrl serve trainer`: rank 0 serves gRPC, other ranks follow its commands."""

    host: str = "127.0.0.1"
    port: int = Field(50061, ge=0, le=65535)  # 0 picks a free port
    metrics_port: int | None = Field(None, ge=0, le=65535)
    trainer: TrainerConfig = TrainerConfig()
    # How rank 0 publishes the policy to the rollout servers (PushWeights).
    weight_sync: WeightSenderConfig = WeightSenderConfig()

    @model_validator(mode="after")
    def _policy_sender(self) -> TrainerServerConfig:
        if self.weight_sync.kind != "policy":
            raise ValueError("weight_sync.kind must be 'policy' for the trainer (drafts: the draft-trainer)")
        return self


class DraftTrainerServerConfig(StrictModel):
    """`specrl serve draft-trainer`: adapts an EAGLE-3 draft on the trainer's captured
    features and publishes it to the rollout servers (docs/draft.md)."""

    host: str = "127.0.0.1"
    port: int = Field(50071, ge=0, le=65535)  # 0 picks a free port
    metrics_port: int | None = Field(None, ge=0, le=65535)
    # host:port of the trainer whose captures it reads (`specrl run` fills it in).
    trainer: str | None = None
    # The draft to start from (path or zoo:NAME; `specrl run`: the rollout servers' draft).
    draft: str | None = None
    # The target whose embedding the draft shares and whose shape it must match; None:
    # the model the trainer reports serving.
    target: str | None = None
    training: DraftTrainingConfig = DraftTrainingConfig()
    # Publish at most once per this many policy versions trained against ...
    publish_every: int = Field(1, ge=1)
    # ... and only a draft whose held-out acceptance estimate is at least the published
    # draft's (both on the same held-out batches) minus this: adaptation never replaces a
    # strong draft by a worse one.
    publish_tolerance: float = Field(0.0, ge=0)
    # Every published draft is also written here (config.json + model.safetensors, the
    # layout vLLM loads); None: not written.
    save_dir: str | None = None
    weight_sync: WeightSenderConfig = WeightSenderConfig(kind="draft")

    @model_validator(mode="after")
    def _draft_sender(self) -> DraftTrainerServerConfig:
        if self.weight_sync.kind != "draft":
            raise ValueError("weight_sync.kind must be 'draft' for the draft-trainer")
        return self


ConfigT = TypeVar("ConfigT", bound=BaseModel)


class ConfigError(ValueError):
    """A config file that does not validate; the message names every bad field."""


def load_config(path: str | Path, cls: type[ConfigT], overrides: dict | None = None) -> ConfigT:
    """Read YAML at `path`, apply dotted-key `overrides`, validate into `cls`."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return validate(data, cls, str(path), overrides)


def _field_path(cls: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """An error's location as the file's keys: pydantic puts a discriminated union's tag
    in it (`engine.vllm.model`, the engine's kind), which the file has no key for."""
    parts: list[str] = []
    node: object = cls
    tag_next = False
    for item in loc:
        if tag_next:
            tag_next = False
            continue
        parts.append(str(item))
        fields = node.model_fields if isinstance(node, type) and issubclass(node, BaseModel) else {}
        field = fields.get(str(item))
        node = field.annotation if field else None
        tag_next = field is not None and any(isinstance(m, Discriminator) for m in field.metadata)
    return ".".join(parts)


def validate(data: dict, cls: type[ConfigT], source: str, overrides: dict | None = None) -> ConfigT:
    """`data` with dotted-key `overrides` applied, validated into `cls`; ConfigError
    names `source` and every bad field."""
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        lines = [f"{source}: invalid {cls.__name__}:"]
        for err in e.errors():
            where = _field_path(cls, err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None


# -- `specrl run`: the orchestrator and the system it drives -------------------------


class ChatConfig(StrictModel):
    """Prompts through the policy tokenizer's own chat template (`apply_chat_template`,
    generation prompt added): what a chat model (Qwen3-8B, ...) was tuned on. Rows whose
    prompt is a list of {role, content} messages always go through it; plain-text rows
    only when `enabled` (wrapped as one user message, after `data.template`)."""

    enabled: bool = False
    # prepended as a system message to rows that have none
    system: str | None = None
    # keyword arguments of the template, e.g. {enable_thinking: false} for Qwen3
    template_kwargs: dict[str, str | int | float | bool] = {}


# The data file formats read from disk (HF datasets' builders); anything else that is not
# a path is a Hugging Face dataset id, read from the local datasets cache.
DATA_FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class DataConfig(StrictModel):
    """Where prompts come from. `source: task` is the zoo's arithmetic task (generated,
    seeded); a path is a file of rows read with HF datasets (.jsonl / .json / .parquet /
    .csv: GSM8K, MATH, DAPO-Math exports as they are); anything else is a Hugging Face
    dataset id (`openai/gsm8k`, with `subset` and `split`) read from the local datasets
    cache. Rows that lack a field, have an empty or malformed prompt, an answer the
    format does not find, or tokenize past the context are skipped and counted
    (docs/data.md)."""

    source: str = "task"
    subset: str | None = None  # a hub dataset's configuration (GSM8K: main)
    split: str = "train"  # a hub dataset's split
    # fields of a row; a dotted name reaches into nested ones (reward_model.ground_truth)
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    # How the answer field states the final answer: gsm8k ("... #### 72"), boxed (a
    # MATH solution ending in \boxed{...}), plain (the answer itself); auto: the first
    # of these that applies to the row.
    answer_format: Literal["auto", "gsm8k", "boxed", "plain"] = "auto"
    # Each plain-text prompt is this with `{prompt}` replaced by the row's text (other
    # braces, e.g. "\\boxed{}", are kept as they are); then, with chat.enabled, the user
    # message.
    template: str = Field("{prompt}", pattern=r"\{prompt\}")
    chat: ChatConfig = ChatConfig()
    prompts_per_step: int = Field(16, ge=1)
    shuffle: bool = True
    seed: int = 0
    # source: task: None draws a fresh problem every time; N makes the task a fixed
    # training set of its first N problems, cycled epoch after epoch like a file.
    task_prompts: int | None = Field(None, ge=1)
    # The task generator's difficulty (source: task); the defaults are the zoo target's
    # training distribution (zoo/build.py ZooSpec).
    task_max_operand: int = Field(20, ge=1)
    task_min_terms: int = Field(2, ge=2)
    task_max_terms: int = Field(2, ge=2)

    @property
    def kind(self) -> Literal["task", "file", "hub"]:
        if self.source == "task":
            return "task"
        path = Path(self.source).expanduser()
        looks_like_path = path.suffix.lower() in DATA_FILE_FORMATS or self.source.startswith(("/", ".", "~"))
        return "file" if path.exists() or looks_like_path else "hub"

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        if self.task_min_terms > self.task_max_terms:
            raise ValueError("data.task_min_terms must be <= task_max_terms")
        if self.kind == "file" and not Path(self.source).expanduser().is_file():
            raise ValueError(
                f"data.source: no such file {self.source!r} (or use 'task', or a hub dataset id)"
            )
        if self.kind != "hub" and (self.subset is not None or self.split != "train"):
            raise ValueError("data.subset and data.split are for a hub dataset id in data.source")
        return self


class SamplingConfig(StrictModel):
    """How each prompt is sampled: `n` samples form its GRPO group."""

    n: int = Field(8, ge=2)
    temperature: float = Field(1.0, gt=0, le=2)  # vLLM's bound
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    max_tokens: int = Field(MAX_COMPLETION_TOKENS, ge=1)
    stop: tuple[str, ...] = ()


class RewardConfig(StrictModel):
    """`math`: exact final answer (specrl.data.rewards); or `module:function`
    taking (completion: str, answer: str) and returning a float."""

    fn: str = Field("math", pattern=r"^(math|[\w.]+:\w+)$")


class OrchestratorConfig(StrictModel):
    """The RL loop."""

    steps: int = Field(20, ge=1)
    # Policy lag bound L: a sample generated by version v is trained on at a step whose
    # policy version is at most v + L. 0 is synchronous RL.
    max_lag: int = Field(0, ge=0)
    # Samples found beyond the bound at training time: dropped (their prompt is
    # generated again), or kept and corrected by truncated importance sampling
    # (needs trainer.grpo.is_cap).
    stale: Literal["drop", "importance"] = "drop"
    # Concurrent Generate calls (prompt groups of sampling.n samples) per rollout replica:
    # its slots. They are calls on one event loop, not threads, so thousands per replica
    # cost the orchestrator no threads or Redis connections. None: from each replica's
    # engine (the max_num_seqs its GetStatus reports) and sampling.n, as
    # ceil(1.25 x max_num_seqs / n), so that the engine's batch stays full as groups finish
    # (16 while a replica's status cannot be read).
    concurrency: int | None = Field(None, ge=1)
    # A prompt's groups go to one replica (rendezvous hashing over the replicas with a
    # free slot) instead of the one with the most free slots, so a prompt that comes back
    # next epoch finds its history (speculation.history) and prefix cache there.
    # None: on when a replica reports drafting from history.
    prompt_affinity: bool | None = None
    # For replicas that draft from history: the last group of responses per prompt kept
    # here (at most this many tokens, 4 bytes each; 0: none) and sent with the prompt's next
    # group to a replica that has not seen the prompt since it started, so history
    # survives a replica restart and follows a prompt to another replica
    # (orchestrator/carry.py).
    history_carry_tokens: int = Field(16_000_000, ge=0)
    # One Generate call (a group of n samples) may take at most this long before it is
    # retried. None: no fixed deadline, so a group of 30k-token samples takes as long as
    # it needs; a replica that stops making progress is caught by generate_stall_s.
    generate_timeout_s: float | None = Field(None, gt=0)
    # A replica with calls in flight whose engine generates no token for this long is
    # stalled: its calls are cancelled and their groups go to other replicas (not counted
    # against the groups); it gets work again once it makes progress, or this long later.
    generate_stall_s: float = Field(120.0, gt=0)
    # Generate calls a group may fail (deadline passed, an error of the replica) before it
    # is dropped as failed: logged, counted (the step's `failed`,
    # specrl_generation_dropped) and replaced by the next prompt, never retried forever.
    # A replica that is down, not ready or behind on weights does not count: the group
    # goes to another replica.
    max_attempts: int = Field(4, ge=1)
    # A prompt or rollout entry pending this long is taken over (its orchestrator died).
    # The prompt entries of calls in flight are marked alive at least every 10 s, so a
    # live call, however long, is never overtaken.
    reclaim_idle_s: float = Field(300.0, ge=30)
    # Fail the run when no rollout arrives for this long (every replica down, say).
    stall_timeout_s: float = Field(1800.0, gt=0)
    # How long `specrl run` waits at start for services running elsewhere (addresses)
    # to serve: in a cluster one may be starting again after a failure.
    services_timeout_s: float = Field(600.0, gt=0)
    # Save a trainer checkpoint every this many steps (0: only at the end). A resumed
    # run restarts from the last one; the steps since are kept in Redis to train again.
    checkpoint_every: int = Field(10, ge=0)
    metrics_port: int | None = Field(None, ge=0, le=65535)
    # The status page and its control API (pause, resume, checkpoint now) on this port
    # (0 picks one); None: off (docs/orchestrator.md, Status page).
    status_port: int | None = Field(None, ge=0, le=65535)
    # The environment variable holding the control API's bearer token; unset, a token is
    # generated and written to <run dir>/control-token (readable by its owner only).
    control_token_env: str = Field("SPECRL_CONTROL_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class RedisConfig(StrictModel):
    # None: `specrl run` starts its own redis-server (append-only file in the run dir).
    url: str | None = None
    aof: bool = True
    # The environment variable holding the password of the Redis at `url` (Kubernetes: a
    # Secret), so that it appears in no config file and in no saved run config.
    password_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @model_validator(mode="after")
    def _check(self) -> RedisConfig:
        if self.password_env and not self.url:
            raise ValueError("redis.password_env is for a Redis at redis.url (the one started here has none)")
        return self

    def password(self) -> str | None:
        if not self.password_env:
            return None
        if (value := os.environ.get(self.password_env)) is None:
            raise ConfigError(f"redis.password_env: ${self.password_env} is not set")
        return value


class AutoscaleConfig(StrictModel):
    """The orchestrator scales the rollout workload itself, through the Kubernetes API,
    toward a target share of each step spent waiting for generation (exposed generation):
    the quantity an RL team watches, where KEDA or an HPA can only see queue depth or
    load. Each decision predicts the exposed share at another replica count from the
    steps measured at this one (generation time inversely proportional to replicas; the
    part hidden behind training stays hidden) and moves to the fewest replicas predicted
    to meet the target, within [min_replicas, max_replicas], by at most `max_factor` at a
    time (docs/orchestrator.md, Autoscaling)."""

    enabled: bool = False
    # The rollout workload's scale subresource: statefulsets/NAME (apps/v1) or
    # leaderworkersets/NAME (leaderworkerset.x-k8s.io/v1, multi-node replicas).
    workload: str = Field("", pattern=r"^((statefulsets|leaderworkersets)/[a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$")
    namespace: str = Field("", pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$")
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(8, ge=1)
    # Exposed generation over step time to aim for: with max_lag >= 1 generation can hide
    # behind training almost entirely; synchronous RL (max_lag 0) always exposes all of it.
    target_exposed_share: float = Field(0.1, gt=0, lt=1)
    # No change while the measured share is within this of the target (hysteresis).
    tolerance: float = Field(0.05, ge=0, lt=1)
    # Steps measured with every replica of the current count in the run before a decision.
    window_steps: int = Field(2, ge=1)
    max_factor: float = Field(2.0, gt=1)

    @model_validator(mode="after")
    def _check(self) -> AutoscaleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"rollout.autoscale: min_replicas {self.min_replicas} > max_replicas {self.max_replicas}"
            )
        return self


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DISCOVER_PATTERN = rf"^(k8s:{_DNS_LABEL}/[a-z0-9]([-a-z0-9.]*[a-z0-9])?:\d+|dns:.+:\d+|file:.+)$"


def _free_port_unless_given(server: object) -> object:
    """A service `specrl run` starts binds a free port unless its `server` section names
    one: the servers' own defaults (50051, 50061, 50071) are for a server started alone,
    and replicas started side by side would all ask for the same one."""
    if isinstance(server, dict) and "port" not in server:
        return {**server, "port": 0}
    return server


class RolloutFleetConfig(StrictModel):
    """The rollout replicas: started by `specrl run` from `server`, already running at
    `addresses`, or found while the run goes on by `discover` (one of the three)."""

    replicas: int = Field(1, ge=0)
    addresses: tuple[str, ...] = ()
    # Elastic replicas: "k8s:NAMESPACE/SERVICE:PORT" (the Service's EndpointSlices,
    # watched through the Kubernetes API: a pod that appears or goes away is seen at once),
    # "dns:NAME:PORT" (every address NAME resolves to, e.g. a headless Service) or
    # "file:PATH" (host:port per line); DNS and files are looked up again every
    # `discover_every_s`. A replica that appears joins once it holds the current policy;
    # one that goes away is dropped (its prompts in flight are generated elsewhere).
    discover: str | None = Field(
        None,
        pattern=r"^(k8s:[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?:\d+|dns:.+:\d+|file:.+)$",
    )
    discover_every_s: float = Field(10.0, gt=0)
    # With `discover`: how long the run waits at start for a first replica that serves.
    discover_timeout_s: float = Field(600.0, gt=0)
    server: RolloutServerConfig = RolloutServerConfig(port=0)
    _server_port = field_validator("server", mode="before")(_free_port_unless_given)
    # A replica started here that dies is started again on its address, up to this many
    # times each (the run goes on; the trainer catches it up to the current policy);
    # past that, or with 0, the run stops with its state kept (`specrl run --resume`).
    max_restarts: int = Field(3, ge=0)
    autoscale: AutoscaleConfig = AutoscaleConfig()

    @model_validator(mode="after")
    def _check(self) -> RolloutFleetConfig:
        given = [
            name
            for name, on in (
                ("replicas", self.replicas),
                ("addresses", self.addresses),
                ("discover", self.discover),
            )
            if on
        ]
        if len(given) != 1:
            raise ValueError(
                "rollout: give one of replicas >= 1 (started here), addresses (running) or discover "
                f"(found at run time); got {', '.join(given) or 'none'}"
            )
        return self

    @property
    def elsewhere(self) -> bool:
        """The replicas run elsewhere (not started by `specrl run`)."""
        return bool(self.addresses or self.discover)


class TrainerFleetConfig(StrictModel):
    """The trainer: started by `specrl run` (tp x dp ranks) from `server`, or already
    running at `address`."""

    address: str | None = None
    server: TrainerServerConfig = TrainerServerConfig(port=0)
    _server_port = field_validator("server", mode="before")(_free_port_unless_given)


class DraftTrainerFleetConfig(StrictModel):
    """The draft-trainer: off, started by `specrl run` from `server` (its trainer and
    draft filled in from the run), or already running at `address`."""

    enabled: bool = False
    address: str | None = None
    server: DraftTrainerServerConfig = DraftTrainerServerConfig(port=0)
    _server_port = field_validator("server", mode="before")(_free_port_unless_given)


class RayLauncherConfig(StrictModel):
    """`launcher: ray`: the services `specrl run` starts run as Ray actors on a Ray cluster
    (KubeRay, Anyscale, `ray start`), placed as the Helm chart places pods
    (orchestrator/ray_launcher.py, docs/orchestrator.md "On a Ray cluster")."""

    # The cluster: "auto" (the one this machine belongs to), "HOST:PORT" (its GCS) or
    # "ray://HOST:10001" (Ray Client). None: $RAY_ADDRESS.
    address: str | None = None
    namespace: str = Field("specrl", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # Whether the services take GPUs: a rollout replica its engine's tensor_parallel_size
    # (one bundle; with engine.nnodes N, N bundles of a share each), a trainer rank one,
    # the draft-trainer one. False: CPU builds.
    gpus: bool = True
    # Trainer ranks per bundle: one node's GPUs (the chart's trainer.procsPerNode); the
    # ranks of one bundle share a node, so their collectives stay on its NVLink.
    trainer_procs_per_node: int = Field(1, ge=1)
    cpus_per_process: float = Field(1.0, gt=0)
    # How long the placement groups may wait for resources (an autoscaling cluster adds
    # nodes) before the run gives up, naming what is missing.
    placement_timeout_s: float = Field(300.0, gt=0)


CompareRun = Literal["ar", "async", "hybrid"]


class CompareConfig(StrictModel):
    """Short runs of the same job after the main one, from the same initial weights, seeds
    and prompts, reported beside it (`make demo`: the speculative run's stage breakdown
    next to AR's, and asynchronous RL's exposed generation). `ar`: the main run without
    speculation; `async`: the main run with policy lag 1; `hybrid`: the main run's draft
    model with drafts from history where history has a confident match
    (speculation.history.hybrid)."""

    runs: tuple[CompareRun, ...] = ()
    # Steps per comparison run; the side-by-side table compares the first `steps` steps of
    # every run, leaving out the first (it warms engines and caches up).
    steps: int = Field(4, ge=2)


class RunConfig(StrictModel):
    """`specrl run --config FILE`: the whole system on one machine, or the orchestrator
    against services running elsewhere."""

    name: str = Field("specrl", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # Run directory: step log (JSONL), report, checkpoints, Redis data. Relative paths
    # are under the current directory.
    output_dir: str = "runs/{name}"
    seed: int = 0
    data: DataConfig = DataConfig()
    sampling: SamplingConfig = SamplingConfig()
    reward: RewardConfig = RewardConfig()
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    redis: RedisConfig = RedisConfig()
    rollout: RolloutFleetConfig = RolloutFleetConfig()
    trainer: TrainerFleetConfig = TrainerFleetConfig()
    draft_trainer: DraftTrainerFleetConfig = DraftTrainerFleetConfig()
    compare: CompareConfig = CompareConfig()
    # Where the services started here run: child processes of `specrl run` (local) or
    # Ray actors on a Ray cluster (ray, configured by `ray`).
    launcher: Literal["local", "ray"] = "local"
    ray: RayLauncherConfig = RayLauncherConfig()

    @model_validator(mode="after")
    def _agree(self) -> RunConfig:
        """Fields several services must agree on, checked once before anything starts
        (for the services started here; ones reached by address are checked live)."""
        engine, trainer = self.rollout.server.engine, self.trainer.server.trainer
        local_rollout, local_trainer = not self.rollout.elsewhere, self.trainer.address is None
        if local_rollout and local_trainer and engine.model != trainer.model:
            raise ValueError(
                f"rollout.server.engine.model ({engine.model}) and trainer.server.trainer.model "
                f"({trainer.model}) must be the same policy"
            )
        if local_rollout and engine.nnodes > 1 and self.launcher != "ray":
            raise ValueError(
                "rollout.server.engine.nnodes > 1: `specrl run` starts one-machine replicas here "
                "(launcher: ray places multi-node ones); start a multi-node replica with `specrl "
                "serve rollout` and `rollout-worker` and give its address"
            )
        if self.launcher == "local" and self.rollout.replicas > 1 and self.rollout.server.port:
            raise ValueError(
                f"rollout.server.port ({self.rollout.server.port}): the {self.rollout.replicas} "
                "replicas started on this machine cannot share one port; leave port out (each "
                "takes a free one)"
            )
        if local_rollout and self.sampling.max_tokens >= engine.max_model_len:
            raise ValueError(
                f"sampling.max_tokens ({self.sampling.max_tokens}) leaves no room for a prompt in "
                f"rollout.server.engine.max_model_len ({engine.max_model_len})"
            )
        if local_trainer and self.orchestrator.stale == "importance" and trainer.grpo.is_cap is None:
            raise ValueError("orchestrator.stale: importance needs trainer.server.trainer.grpo.is_cap")
        batch = self.data.prompts_per_step * self.sampling.n
        if local_trainer and batch % trainer.dp:
            raise ValueError(f"prompts_per_step x n ({batch}) must split across trainer dp ({trainer.dp})")
        if self.draft_trainer.enabled:
            self._check_draft_trainer()
        if self.compare.runs:
            self._check_compare()
        if self.launcher != "ray" and self.ray != RayLauncherConfig():
            raise ValueError("ray: has no effect with launcher local (set launcher: ray)")
        self._check_autoscale()
        world, per_node = trainer.tp * trainer.dp, self.ray.trainer_procs_per_node
        if self.launcher == "ray" and local_trainer and world % per_node:
            raise ValueError(
                f"ray.trainer_procs_per_node ({per_node}) must divide the trainer's tp x dp ranks ({world})"
            )
        return self

    def _check_autoscale(self) -> None:
        """The orchestrator scales a Kubernetes workload whose replicas it finds by
        rollout.discover, or (launcher: ray) the rollout actors the run started itself."""
        scale, rollout = self.rollout.autoscale, self.rollout
        if not scale.enabled:
            return
        if self.launcher == "ray":
            if not rollout.replicas:
                raise ValueError("rollout.autoscale with launcher: ray scales the replicas the run starts: "
                                 "set rollout.replicas (the count it starts with)")  # fmt: skip
            return
        if not rollout.discover:
            raise ValueError("rollout.autoscale needs rollout.discover: the replicas it scales join by it")
        if not (scale.workload and scale.namespace):
            raise ValueError("rollout.autoscale: set workload (statefulsets/NAME) and namespace")

    def _check_compare(self) -> None:
        runs = self.compare.runs
        if len(set(runs)) != len(runs):
            raise ValueError(f"compare.runs lists a run twice: {list(runs)}")
        remote = self.rollout.elsewhere or self.trainer.address or self.draft_trainer.address
        if remote:
            raise ValueError(
                "compare.runs needs the services started here (a comparison changes how they run); "
                "drop rollout.addresses / rollout.discover / trainer.address / draft_trainer.address"
            )
        if "ar" in runs and self.rollout.server.speculation.method == "none":
            raise ValueError("compare.runs: 'ar' is the main run itself (speculation.method is none)")
        spec = self.rollout.server.speculation
        if "hybrid" in runs and (not has_draft_model(spec.method) or spec.history.hybrid):
            raise ValueError(
                "compare.runs: 'hybrid' adds history to the main run's draft model: it needs "
                f"speculation.method eagle3 or draft_model without history.hybrid (method {spec.method!r}, "
                f"hybrid {spec.history.hybrid})"
            )
        if "async" in runs and self.orchestrator.max_lag > 0:
            raise ValueError(
                f"compare.runs: 'async' (lag 1) needs a synchronous main run; orchestrator.max_lag is "
                f"{self.orchestrator.max_lag}"
            )

    def _check_draft_trainer(self) -> None:
        spec = self.rollout.server.speculation
        if not self.rollout.elsewhere and spec.method != "eagle3":
            raise ValueError(
                f"draft_trainer.enabled adapts an EAGLE-3 draft; rollout.server.speculation.method "
                f"is {spec.method!r}"
            )
        if self.trainer.address is None and not self.trainer.server.trainer.capture.enabled:
            raise ValueError(
                "draft_trainer.enabled needs the trainer's features: set "
                "trainer.server.trainer.capture.enabled: true"
            )
        d = self.draft_trainer
        if d.address is None and self.rollout.elsewhere and not d.server.draft:
            raise ValueError("draft_trainer.server.draft is required when the rollout servers run elsewhere")

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir.format(name=self.name))

    def local_models(self) -> list[str]:
        """The model references the services `specrl run` starts itself will load."""
        server = self.rollout.server
        refs = [] if self.rollout.elsewhere else [server.engine.model, server.speculation.draft]
        if self.trainer.address is None:
            refs.append(self.trainer.server.trainer.model)
        return [r for r in refs if r]


class DraftInitConfig(StrictModel):
    """`specrl draft init`: offline (in-domain) initialization of an EAGLE-3 draft from
    the target's own rollouts on the task's prompts (docs/draft.md)."""

    target: str
    out: str
    # Prompts: the zoo task or a {prompt, answer} file, as `specrl run` reads them.
    data: DataConfig = DataConfig()
    prompts: int = Field(512, ge=2)
    samples_per_prompt: int = Field(1, ge=1)
    max_tokens: int = Field(MAX_COMPLETION_TOKENS, ge=1)
    temperature: float = Field(1.0, ge=0)
    # An EAGLE-3 draft to continue from; None: a fresh head shaped after the target, its
    # norm and output layer copied from the target's.
    start_from: str | None = None
    # Fresh heads only; None: the default for the target's depth.
    aux_layer_ids: tuple[int, ...] | None = None
    # Fresh heads only: propose only the this-many target tokens most frequent in the
    # rollouts (EAGLE-3's smaller output layer for large vocabularies, e.g. 32000 of
    # Qwen3's 151936); None: every target token.
    draft_vocab_size: int | None = Field(None, ge=1)
    steps: int = Field(300, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0)
    ttt_steps: int = Field(3, ge=1)
    # Rollouts kept out of training to measure held-out agreement before and after.
    holdout: int = Field(64, ge=1)
    seed: int = 0
    # A running rollout server of the target to sample from; None: one is started here
    # from `rollout` (engine.model set to the target).
    server: str | None = None
    rollout: RolloutServerConfig = RolloutServerConfig(port=0, self_test=SelfTestConfig(enabled=False))

    @model_validator(mode="after")
    def _check(self) -> DraftInitConfig:
        if self.holdout >= self.prompts * self.samples_per_prompt:
            raise ValueError(f"holdout ({self.holdout}) leaves no rollout to train on")
        if self.start_from and self.aux_layer_ids:
            raise ValueError("aux_layer_ids is the start_from draft's; give one or the other")
        if self.start_from and self.draft_vocab_size:
            raise ValueError("draft_vocab_size is the start_from draft's; give one or the other")
        if self.rollout.speculation.enabled:
            raise ValueError("rollout.speculation: the target's rollouts are sampled without speculation")
        return self
