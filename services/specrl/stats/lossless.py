"""Losslessness, checked against the exact target distribution.

The exact distribution of short continuations is computed independently of the engine
with the HF model: enumerate every continuation of `length` tokens whose probability is at
least `min_prob` (the rest is one pooled outcome whose mass is known exactly). Samples
drawn through a rollout server are then compared to it with the chi-square test in
`specrl.stats.exact`. Used by `specrl verify lossless` and the test suite.

At the system level (whole RL runs with and without speculation) the comparison is of the
runs' rewards: `specrl.stats.runs`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from specrl.stats.exact import FitResult, goodness_of_fit, noncentral_power, processed_probs

Continuation = tuple[int, ...]

# A zoo-task prompt on which the target is uncertain for three tokens (the second operand:
# ~20 continuations with 5-10% each). Its "1" and "2" recur in the continuations, so n-gram
# drafting matching single tokens (prompt_lookup_min 1) proposes tokens that are sometimes
# accepted; the zoo's task has no prompt with a repeated two-token suffix.
PROBE_PROMPT = "Q: 12+"

SETTINGS: tuple[dict, ...] = (
    {"temperature": 1.0, "top_p": 1.0},
    {"temperature": 0.7, "top_p": 1.0},
    {"temperature": 1.0, "top_p": 0.9},
)


@torch.no_grad()
def continuation_distribution(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    *,
    length: int,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    eos_id: int | None = None,
    min_prob: float = 1e-4,
) -> dict[Continuation, float]:
    """Exact probabilities of every continuation (up to `length` tokens, or ending at EOS)
    with probability >= min_prob. Missing mass belongs to the continuations left out.
    Continuations made impossible by top-k / top-p after a kept prefix are listed with
    probability 0, so a sampler that ever produces one fails the test outright."""
    done: dict[Continuation, float] = {}
    frontier: list[tuple[Continuation, float]] = [((), 1.0)]
    for depth in range(length):
        if not frontier:
            break
        ids = torch.tensor([list(prompt_ids) + list(prefix) for prefix, _ in frontier])
        logits = model(input_ids=ids).logits[:, -1, :]
        probs = processed_probs(logits, temperature=temperature, top_p=top_p, top_k=top_k)
        nxt: list[tuple[Continuation, float]] = []
        for (prefix, mass), row in zip(frontier, probs.tolist()):
            for tok, p in enumerate(row):
                q = mass * p
                seq = (*prefix, tok)
                if p == 0.0:
                    done[seq] = 0.0
                    continue
                if q < min_prob:
                    continue
                if tok == eos_id or depth == length - 1:
                    done[seq] = q
                else:
                    nxt.append((seq, q))
        frontier = nxt
    return done


def empirical(samples: Iterable[Sequence[int]], length: int, exact: dict[Continuation, float]) -> Counter:
    """Counts of sampled continuations; a sample whose prefix is an impossible continuation
    (probability 0 in `exact`) is counted under that prefix."""
    out: Counter = Counter()
    for s in samples:
        seq = tuple(s[:length])
        key = next((seq[:i] for i in range(1, len(seq)) if exact.get(seq[:i]) == 0.0), seq)
        out[key] += 1
    return out


@dataclass(frozen=True)
class LosslessCheck:
    setting: dict
    fit: FitResult
    power_at_tv05: float
    acceptance_length: float

    def row(self) -> dict:
        return {
            **self.setting,
            "n": self.fit.n,
            "chi2": round(self.fit.statistic, 2),
            "dof": self.fit.dof,
            "p_value": self.fit.p_value,
            "tv": round(self.fit.total_variation, 4),
            "power_at_tv_0.05": round(self.power_at_tv05, 4),
            "acceptance_length": round(self.acceptance_length, 3),
        }


def check_samples(
    samples: Sequence[Sequence[int]],
    exact: dict[Continuation, float],
    *,
    length: int,
    setting: dict,
    alpha: float,
    acceptance_length: float = 1.0,
) -> LosslessCheck:
    fit = goodness_of_fit(empirical(samples, length, exact), exact)
    return LosslessCheck(
        setting=setting,
        fit=fit,
        power_at_tv05=noncentral_power(n=fit.n, tv=0.05, dof=fit.dof, alpha=alpha),
        acceptance_length=acceptance_length,
    )


def verify_server(
    address: str,
    *,
    model: str | None,
    samples: int,
    alpha: float,
    length: int = 3,
    seed: int | None = None,
    requests: int = 1,
    console=None,
) -> dict:
    """Sample through a running rollout server under each SETTINGS entry and test the
    continuations of PROBE_PROMPT against the exact distribution of `model` (default: the
    path the server reports). With `seed`, sample j of setting i has seed
    seed + i * samples + j (vLLM seeds the n samples of a request from its seed up), the
    way the orchestrator seeds rollouts: a rerun samples the same and its verdict is the
    same; unseeded, each run is a fresh draw that a correct sampler fails with
    probability alpha per setting. `requests` splits each setting's samples over that many
    requests of the prompt, one after another, pooled into one check: history drafts from
    the earlier requests of a prompt, so a check over many requests covers drafts from a
    growing history, and a large check needs no single request of that many sequences
    (seeds run on across the requests as over one)."""
    if not 1 <= requests <= samples:
        raise ValueError(f"requests must be between 1 and samples ({samples}), got {requests}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specrl.rollout.api import RolloutClient

    with RolloutClient(address) as client:
        status = client.status()
        path = model or status.model
        tok = AutoTokenizer.from_pretrained(path)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        prompt_ids = tok(PROBE_PROMPT, add_special_tokens=False)["input_ids"]
        rows, passed = [], True
        for i, setting in enumerate(SETTINGS):
            exact = continuation_distribution(
                hf, prompt_ids, length=length, eos_id=tok.eos_token_id, **setting
            )
            sampled = []
            for r in range(requests):
                n = samples // requests + (r < samples % requests)
                seeds = {} if seed is None else {"seed": seed + i * samples + len(sampled)}
                resp = client.generate(
                    [prompt_ids], n=n, max_tokens=length, return_text=False, **seeds, **setting
                )
                sampled += resp.samples
                if console is not None and requests > 1:
                    console.print(
                        f"[dim]T={setting['temperature']} top_p={setting['top_p']}: "
                        f"request {r + 1}/{requests}, {len(sampled)}/{samples} samples[/dim]"
                    )
            acc = [s.acceptance for s in sampled]
            drafts = sum(a.drafts for a in acc)
            al = 1 + sum(a.accepted_tokens for a in acc) / drafts if drafts else 1.0
            check = check_samples(
                [list(s.token_ids) for s in sampled],
                exact,
                length=length,
                setting=setting,
                alpha=alpha,
                acceptance_length=al,
            )
            ok = check.fit.passed(alpha)
            passed &= ok
            rows.append({**check.row(), "passed": ok})
            if console is not None:
                console.print(
                    f"{'[green]PASS[/green]' if ok else '[red]FAIL[/red]'} "
                    f"T={setting['temperature']} top_p={setting['top_p']}: "
                    f"p={check.fit.p_value:.3g} TV={check.fit.total_variation:.3f} "
                    f"(n={check.fit.n}, power at TV 0.05: {check.power_at_tv05:.3f}, "
                    f"acceptance length {al:.2f})"
                )
    return {
        "address": address,
        "model": path,
        "speculation": status.speculation_method,
        "k": status.num_speculative_tokens,
        "alpha": alpha,
        "seed": seed,
        "requests": requests,
        "passed": passed,
        "checks": rows,
    }
