"""The policy being trained: an HF causal LM (Qwen3 / Llama; the zoo target in tests,
Qwen3-8B in production), its frozen reference, AdamW, and one GRPO step.

Every rank calls the same methods with the same global batch (rank 0 receives it and the
service broadcasts it); each data-parallel rank takes its contiguous share of the rows,
tensor-parallel ranks take the same rows. Losses are token-level: sums divided by the
global number of completion tokens, so the result does not depend on how the batch is
split across ranks or micro-batches.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from specrl.config import TrainerConfig, resolve_model_path
from specrl.trainer import parallel
from specrl.trainer.batch import TrainBatch
from specrl.trainer.capture import Captured, Capturer
from specrl.trainer.grpo import LossParts, group_advantages, grpo_token_loss

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Forward:
    tokens: torch.Tensor  # [B, L-1] logprob of each next token, float32
    logp: torch.Tensor  # [B, L-1, V] next-token log-softmax
    hidden_states: tuple[torch.Tensor, ...] | None

    def entropy(self) -> torch.Tensor:
        return -(self.logp.exp() * self.logp).sum(-1)


def forward(model: nn.Module, batch: TrainBatch, *, hidden_states: bool = False) -> Forward:
    """One forward of `model` over the batch: next-token logprobs (and, for capture, the
    residual stream after every layer)."""
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=hidden_states
    )
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
    tokens = logp.gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return Forward(tokens, logp, out.hidden_states if hidden_states else None)


@dataclass
class StepMetrics:
    loss: float
    pg_loss: float
    kl: float
    clip_fraction: float
    entropy: float
    grad_norm: float
    is_weight: float
    tokens: int
    logprob_seconds: float
    train_seconds: float
    advantages_nonzero: float
    mismatch: Mismatch | None = None


@dataclass
class Mismatch:
    """Training-inference mismatch on completion tokens: mean(rollout - trainer) logprob
    (an estimate of KL(engine || trainer) on the engine's samples) and the max |diff|."""

    kl: float
    max_abs: float
    tokens: int


def mismatch(trainer: torch.Tensor, rollout: torch.Tensor | None, mask: torch.Tensor) -> Mismatch | None:
    if rollout is None:
        return None
    on = mask.bool()
    diff = (rollout - trainer)[on]
    if diff.numel() == 0:
        return Mismatch(0.0, 0.0, 0)
    return Mismatch(diff.mean().item(), diff.abs().max().item(), int(diff.numel()))


class Policy:
    def __init__(self, cfg: TrainerConfig, device: torch.device | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.device = device or torch.device("cpu")
        torch.manual_seed(cfg.seed)
        path = resolve_model_path(cfg.model)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[cfg.dtype]).to(self.device)
        self.vocab_size = model.config.vocab_size
        self.reference = None
        if cfg.grpo.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        mesh = parallel.build_mesh(cfg.tp, cfg.dp, self.device.type)
        self.dp_rank, self.dp_size, self.dp_group = 0, cfg.dp, None
        if mesh is not None:
            self.dp_rank, self.dp_group = mesh["dp"].get_local_rank(), mesh["dp"].get_group()
            for m in filter(None, (model, self.reference)):
                if cfg.tp > 1:
                    parallel.apply_tp(m, mesh["tp"])
                if cfg.dp > 1:
                    parallel.apply_fsdp(m, mesh["dp"])
        self.model = model
        self.capturer = None
        tp_rank = mesh["tp"].get_local_rank() if mesh is not None else 0
        if cfg.capture.enabled and tp_rank == 0:  # TP ranks hold identical activations
            self.capturer = Capturer(cfg.capture, model.config.num_hidden_layers, cfg.seed)
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, foreach=False
        )
        self.step_count = 0

    # -- batches ------------------------------------------------------------------

    def _local(self, batch: TrainBatch) -> tuple[TrainBatch, slice]:
        """This data-parallel rank's contiguous rows of the global batch."""
        if batch.size % self.dp_size:
            raise ValueError(f"batch of {batch.size} does not split across dp={self.dp_size} ranks")
        n = batch.size // self.dp_size
        rows = slice(self.dp_rank * n, (self.dp_rank + 1) * n)
        return batch.rows(rows), rows

    def _micro(self, size: int) -> list[slice]:
        mb = self.cfg.micro_batch_size
        return [slice(i, min(i + mb, size)) for i in range(0, size, mb)]

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, *, reference: bool = False, capture: bool = False) -> torch.Tensor:
        """Next-token logprobs [B, L-1] of the global batch under the current policy (or
        the frozen reference), computed in micro-batches and gathered across DP ranks.
        With `capture`, the same forward also hands the draft-trainer its features."""
        model = self.reference if reference else self.model
        if model is None:
            raise ValueError("no reference policy (grpo.kl_coef is 0)")
        capturer = self.capturer if capture and not reference else None
        local, _ = self._local(batch.to(self.device))
        parts, taken = [], []
        for s in self._micro(local.size):
            mb = local.rows(s)
            f = forward(model, mb, hidden_states=capturer is not None)
            if capturer is not None:
                assert f.hidden_states is not None
                taken.append(
                    capturer.capture(
                        f.hidden_states, f.logp, mb.input_ids, mb.attention_mask, mb.mask, self.step_count
                    )
                )
            parts.append(f.tokens)
        if capturer is not None:
            for c in self._gather_captures(taken):
                capturer.queue.put(c)
        out = torch.cat(parts)
        if self.dp_size > 1:
            gathered = [torch.empty_like(out) for _ in range(self.dp_size)]
            dist.all_gather(gathered, out, group=self.dp_group)
            out = torch.cat(gathered)
        return out

    def _gather_captures(self, taken: list[Captured]) -> list[Captured]:
        """Every DP rank's captured micro-batches, in rank order, on DP rank 0 (the one
        that serves them to the draft-trainer); an empty list on the others. Only the
        TP-rank-0 ranks capture, and the DP group of TP rank 0 is exactly them."""
        if self.dp_size == 1:
            return taken
        gathered: list[list[Captured]] | None = (
            [[] for _ in range(self.dp_size)] if self.dp_rank == 0 else None
        )
        dist.gather_object(taken, gathered, dst=dist.get_global_rank(self.dp_group, 0), group=self.dp_group)
        return [c for part in gathered for c in part] if gathered is not None else []

    # -- training -----------------------------------------------------------------

    def train_step(self, batch: TrainBatch, group_size: int) -> StepMetrics:
        """One GRPO step on the global batch (groups of `group_size` consecutive
        samples): the behaviour policy's logprobs once, then `grpo.epochs` optimizer
        steps over the whole batch against them (clipped, PPO style). The policy version
        advances by one. Metrics are those of the last epoch."""
        t0 = time.perf_counter()
        version = self.step_count  # the policy the batch's old logprobs come from
        batch = batch.to(self.device)
        old = self.logprobs(batch, capture=True)
        ref = self.logprobs(batch, reference=True) if self.reference is not None else None
        t1 = time.perf_counter()
        g = self.cfg.grpo
        advantages = group_advantages(batch.rewards, group_size, normalize_std=g.normalize_std)
        total_tokens = batch.mask.sum()
        self.model.train()
        for _ in range(g.epochs):
            sums, grad_norm = self._update(batch, old, ref, advantages, total_tokens)
        self.step_count += 1
        t2 = time.perf_counter()
        totals = self._sum_over_dp(sums)
        n = total_tokens.item()
        return StepMetrics(
            loss=totals["loss"] / n,
            pg_loss=totals["pg"] / n,
            kl=totals["kl"] / n,
            clip_fraction=totals["clipped"] / n,
            entropy=totals["entropy"] / n,
            grad_norm=grad_norm,
            is_weight=totals["is_weight"] / n,
            tokens=int(n),
            logprob_seconds=t1 - t0,
            train_seconds=t2 - t1,
            advantages_nonzero=(advantages != 0).float().mean().item(),
            mismatch=mismatch(old, batch.rollout_logprobs, batch.mask_of_version(version)),
        )

    def _update(
        self,
        batch: TrainBatch,
        old: torch.Tensor,
        ref: torch.Tensor | None,
        advantages: torch.Tensor,
        total_tokens: torch.Tensor,
    ) -> tuple[dict[str, float], float]:
        """One optimizer step over this rank's share of the batch, in micro-batches;
        returns this rank's sums of the loss parts and the global gradient norm."""
        g = self.cfg.grpo
        local, rows = self._local(batch)
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"pg": 0.0, "kl": 0.0, "clipped": 0.0, "is_weight": 0.0, "entropy": 0.0, "loss": 0.0}
        for s in self._micro(local.size):
            mb = local.rows(s)
            idx = slice(rows.start + s.start, rows.start + s.stop)
            f = forward(self.model, mb)
            entropy = f.entropy()
            parts: LossParts = grpo_token_loss(
                f.tokens,
                old[idx],
                advantages[idx],
                mb.mask,
                g,
                ref_logprobs=None if ref is None else ref[idx],
                rollout_logprobs=mb.rollout_logprobs,
            )
            # FSDP averages gradients over DP ranks; scale so the result is the global sum
            (parts.loss * (self.dp_size / total_tokens)).backward()
            sums["loss"] += parts.loss.item()
            for k in ("pg", "kl", "clipped", "is_weight"):
                sums[k] += getattr(parts, k).item()
            sums["entropy"] += (entropy.detach() * mb.mask).sum().item()
        parallel.sync_tp_partial_grads(self.model)
        grad_norm = parallel.clip_grad_norm(list(self.model.parameters()), self.cfg.optim.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        self.optimizer.step()
        return sums, grad_norm

    def learning_rate(self) -> float:
        """This step's learning rate: a function of the step count alone, so a resumed
        run continues the schedule exactly."""
        o = self.cfg.optim
        return o.lr * min(1.0, (self.step_count + 1) / o.warmup_steps) if o.warmup_steps else o.lr

    def _sum_over_dp(self, sums: dict[str, float]) -> dict[str, float]:
        if self.dp_size == 1:
            return sums
        keys = sorted(sums)
        t = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t, group=self.dp_group)
        return dict(zip(keys, t.tolist()))

    def full_state(self, *, keep: bool = True) -> dict[str, torch.Tensor]:
        """Every parameter, unsharded (DTensors gathered), under HF names, on CPU. A
        collective with TP / DP: every rank calls it; ranks that do not need the result
        pass keep=False and hold no copy (only one tensor at a time)."""
        out = {}
        for name, p in self.model.named_parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            if keep:
                out[name] = t.detach().to("cpu", copy=True)
        return out
