"""Turn a GenerateRequest into plain validated inputs, or name the field that is wrong.

The servicer maps `RequestError` to INVALID_ARGUMENT; nothing a client sends reaches the
engine unvalidated, so bad input can never take the server down.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specrl.rollout.engines.base import DEFAULT_MAX_TOKENS, Sampling
from specrl.v1 import rollout_pb2 as pb


class RequestError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


MAX_TEMPERATURE = 2.0  # vLLM refuses hotter sampling


@dataclass(frozen=True)
class Limits:
    vocab_size: int
    max_model_len: int
    max_samples_per_request: int
    max_n: int | None = None  # the engine's own limit on samples per prompt


def parse_sampling(s: pb.SamplingParams, vocab_size: int) -> Sampling:
    temperature = s.temperature if s.HasField("temperature") else 1.0
    if not (0.0 <= temperature <= MAX_TEMPERATURE):
        raise RequestError("sampling.temperature", f"must be in [0, {MAX_TEMPERATURE:g}], got {temperature}")
    top_p = s.top_p if s.HasField("top_p") else 1.0
    if not (0.0 < top_p <= 1.0):
        raise RequestError("sampling.top_p", f"must be in (0, 1], got {top_p}")
    top_k = s.top_k if s.HasField("top_k") else -1
    if top_k == 0 or top_k < -1:
        raise RequestError("sampling.top_k", f"must be -1 (off) or >= 1, got {top_k}")
    max_tokens = s.max_tokens if s.HasField("max_tokens") else DEFAULT_MAX_TOKENS
    if max_tokens < 1:
        raise RequestError("sampling.max_tokens", f"must be >= 1, got {max_tokens}")
    n = s.n if s.HasField("n") else 1
    if n < 1:
        raise RequestError("sampling.n", f"must be >= 1, got {n}")
    if any(not stop for stop in s.stop):
        raise RequestError("sampling.stop", "stop strings must be non-empty")
    if bad := [t for t in s.stop_token_ids if not 0 <= t < vocab_size]:
        raise RequestError("sampling.stop_token_ids", f"{bad} outside the vocabulary [0, {vocab_size})")
    return Sampling(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_tokens=max_tokens,
        n=n,
        seed=s.seed if s.HasField("seed") else None,
        stop=tuple(s.stop),
        ignore_eos=s.ignore_eos,
        stop_token_ids=tuple(s.stop_token_ids),
    )


def parse_prompts(
    prompts: list[pb.Prompt], tokenize: Callable[[str], list[int]], limits: Limits
) -> list[list[int]]:
    if not prompts:
        raise RequestError("prompts", "at least one prompt is required")
    out: list[list[int]] = []
    for i, p in enumerate(prompts):
        field = f"prompts[{i}]"
        kind = p.WhichOneof("input")
        if kind == "text":
            try:
                text = p.text.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RequestError(f"{field}.text", f"not valid UTF-8 ({e.reason})") from None
            ids = tokenize(text)
        elif kind == "token_ids":
            ids = list(p.token_ids.ids)
            bad = [t for t in ids if not 0 <= t < limits.vocab_size]
            if bad:
                raise RequestError(
                    f"{field}.token_ids",
                    f"ids {bad[:5]} outside the vocabulary [0, {limits.vocab_size})",
                )
        else:
            raise RequestError(field, "set text or token_ids")
        if not ids:
            raise RequestError(field, "empty prompt")
        if len(ids) >= limits.max_model_len:
            raise RequestError(
                field,
                f"prompt is {len(ids)} tokens; the context is {limits.max_model_len} tokens "
                "and at least one must remain for generation",
            )
        out.append(ids)
    return out


def parse_history(prompts: list[pb.Prompt], limits: Limits) -> list[list[list[int]]]:
    """Each prompt's carried responses (Prompt.history), checked like token-id prompts."""
    out: list[list[list[int]]] = []
    for i, p in enumerate(prompts):
        responses = []
        for j, h in enumerate(p.history):
            field = f"prompts[{i}].history[{j}]"
            ids = list(h.ids)
            if bad := [t for t in ids if not 0 <= t < limits.vocab_size]:
                raise RequestError(field, f"ids {bad[:5]} outside the vocabulary [0, {limits.vocab_size})")
            if len(ids) > limits.max_model_len:
                raise RequestError(field, f"{len(ids)} tokens; the context is {limits.max_model_len}")
            responses.append(ids)
        out.append(responses)
    return out


def parse_request(
    req: pb.GenerateRequest, tokenize: Callable[[str], list[int]], limits: Limits
) -> tuple[list[list[int]], Sampling, list[list[list[int]]]]:
    """The prompts' token ids, the sampling, and each prompt's carried history."""
    sampling = parse_sampling(req.sampling, limits.vocab_size)
    prompts = parse_prompts(list(req.prompts), tokenize, limits)
    if limits.max_n is not None and sampling.n > limits.max_n:
        raise RequestError(
            "sampling.n",
            f"must be at most {limits.max_n} (the engine's limit on samples per prompt), got {sampling.n}",
        )
    total = len(prompts) * sampling.n
    if total > limits.max_samples_per_request:
        raise RequestError(
            "sampling.n",
            f"{len(prompts)} prompts x n={sampling.n} = {total} samples exceeds this "
            f"server's max_samples_per_request={limits.max_samples_per_request}",
        )
    return prompts, sampling, parse_history(list(req.prompts), limits)
