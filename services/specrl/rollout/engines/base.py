"""The engine seam of the rollout server: plain data types and the interface every
generation backend implements. Nothing here imports an engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from specrl.weightsync.group import JoinInfo

FinishReason = Literal["stop", "length", "abort"]


# Tokens generated for a request that names no max_tokens (the RL loop always names its
# own, `sampling.max_tokens`).
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class Sampling:
    """Validated sampling parameters of one request (see rollout.proto for semantics)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    max_tokens: int = DEFAULT_MAX_TOKENS
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineStep:
    """One decode step of the engine, as the engine reports it.

    batch: requests in the step; seconds: the engine's time from the previous step's
    output to this one's (the step's whole cost, scheduling included);
    drafted / accepted: per draft position, how many requests drafted / had accepted a
    token at that position (verification of the drafts proposed in the previous step)."""

    batch: int
    seconds: float
    drafted: tuple[int, ...] = ()
    accepted: tuple[int, ...] = ()


@dataclass
class Acceptance:
    """Speculative-decoding counts of one sample."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def acceptance_length(self) -> float:
        """Tokens emitted per verification step: 1 + accepted / drafts."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    @classmethod
    def from_histogram(cls, histogram: Sequence[int], draft_tokens: int) -> Acceptance:
        """From a histogram h[j] = verification steps that accepted exactly j drafts."""
        k = len(histogram) - 1
        return cls(
            drafts=sum(histogram),
            draft_tokens=draft_tokens,
            accepted_tokens=sum(j * c for j, c in enumerate(histogram)),
            # position i is accepted in every step that accepted more than i drafts
            accepted_per_position=[sum(histogram[i + 1 :]) for i in range(k)],
        )


@dataclass
class GeneratedSample:
    sample_index: int
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    acceptance: Acceptance


class UnsupportedEngine(RuntimeError):
    """The installed engine is a release specrl's engine code was not written for: the
    server refuses to start rather than fail at the first weight push."""


@dataclass(frozen=True)
class EngineInfo:
    engine: str
    engine_version: str
    model: str
    method: str
    k: int
    draft: str
    max_model_len: int
    vocab_size: int
    # Processes holding model weights; each joins a weight-sync group.
    workers: int = 1
    # Most samples (n) the engine takes for one prompt; None: no limit of its own.
    max_n: int | None = None


@dataclass(frozen=True)
class SelfTestResult:
    passed: bool
    p_value: float
    detail: str


class Engine(Protocol):
    """A generation backend. One instance serves many concurrent requests."""

    info: EngineInfo
    # Tokens generated since start over every request, unfinished samples included: it
    # advances while the engine makes progress (the orchestrator's no-progress watchdog).
    tokens_generated: int

    async def start(self) -> None:
        """Once, before anything else is asked of the engine."""
        ...

    def tokenize(self, text: str) -> list[int]: ...

    def generate(
        self, prompt_token_ids: list[int], sampling: Sampling, request_id: str
    ) -> AsyncIterator[GeneratedSample]:
        """Yield each of the n samples as it finishes."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def sampler_self_test(self, *, trials: int, alpha: float, seed: int) -> SelfTestResult:
        """Statistical test of the engine's speculative sampler in its own processes."""
        ...

    async def applied_patches(self) -> list[str]:
        """specrl's engine fixes active in the engine's worker processes."""
        ...

    async def join_weight_group(self, info: JoinInfo) -> list[int]:
        """Every worker joins the sender's group; returns their ranks."""
        ...

    async def receive_weights(self, kind: str, epoch: int, manifest: dict) -> dict:
        """Receive one broadcast update into the policy or draft model. Never raises for a
        failed transfer: returns {"ok", "buckets" (loaded before any failure), ...}."""
        ...

    async def reset_prefix_cache(self) -> bool: ...

    async def set_k_schedule(self, schedule: list[tuple[int, int, int]]) -> bool:
        """Draft length by batch size from now on (the engine started with one). Returns
        whether the drafter is paused: k=0 everywhere and the engine skips the drafter's
        work altogether, not only its drafts."""
        ...

    async def seed_history(self, prompt: list[int], responses: list[list[int]]) -> None:
        """Keep `responses` as earlier responses to `prompt` to draft from (a server that
        drafts from history; others ignore them)."""
        ...

    async def history_state(self) -> dict[str, int]:
        """Drafting from history: {"tokens": held}, and for the hybrid {"history": rows,
        "model": rows} drafted by each so far; {} otherwise."""
        ...

    def watch_steps(self, listener: Callable[[EngineStep], None]) -> None:
        """Call `listener` with every decode step (engines started with
        speculation.adaptive; on the event loop that runs `generate`)."""
        ...

    def shutdown(self) -> None: ...
