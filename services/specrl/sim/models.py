"""Model shapes (from each model's public config.json) and the sizes the roofline needs:
parameters streamed per decode step, FLOPs per token, KV cache bytes per token, and for
MoE models the share of experts a step's tokens touch.

Parameter counts are computed from the shape, not copied, so a test can check them
against the published totals (Qwen3-8B 8.2B, Qwen3-235B-A22B 235B / 22B active)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specrl.sim.errors import SimError, unknown


class ModelShape(BaseModel):
    """A decoder-only transformer (Qwen3 / Llama family), dense or MoE."""

    model_config = ConfigDict(frozen=True)

    name: str
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate: int = Field(0, ge=0, description="dense MLP width (0 for all-MoE models)")
    vocab: int = Field(gt=0)
    experts: int = Field(0, ge=0)
    experts_per_token: int = Field(0, ge=0)
    moe_intermediate: int = Field(0, ge=0)
    tied_embeddings: bool = False
    extra_params: int = Field(0, ge=0, description="weights outside the layers (EAGLE-3's fc)")
    source: str = ""

    @model_validator(mode="after")
    def _moe_consistent(self) -> ModelShape:
        moe = (self.experts, self.experts_per_token, self.moe_intermediate)
        if any(moe) and not all(moe):
            raise SimError(f"{self.name}: experts, experts_per_token and moe_intermediate go together")
        if self.experts_per_token > self.experts:
            raise SimError(
                f"{self.name}: experts_per_token {self.experts_per_token} > experts {self.experts}"
            )
        if not self.intermediate and not self.experts:
            raise SimError(f"{self.name}: needs a dense MLP (intermediate) or experts")
        return self

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def attention_params(self) -> int:
        """q, k, v, o projections of one layer."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return self.hidden * (2 * q + 2 * kv)

    @property
    def expert_params(self) -> int:
        """One expert's SwiGLU weights (gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def dense_layer_params(self) -> int:
        """Weights of one layer every token uses: attention, dense MLP, MoE router."""
        return self.attention_params + 3 * self.hidden * self.intermediate + self.hidden * self.experts

    @property
    def embedding_params(self) -> int:
        """The input embedding table when it is not the output head (looked up, not streamed)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        layer = self.dense_layer_params + self.experts * self.expert_params
        return self.layers * layer + self.head_params + self.embedding_params + self.extra_params

    @property
    def active_params(self) -> int:
        """Weights one token multiplies with (the published "A22B" number)."""
        layer = self.dense_layer_params + self.experts_per_token * self.expert_params
        return self.layers * layer + self.head_params + self.embedding_params + self.extra_params

    @property
    def kv_elements_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim

    def streamed_params(self, tokens: float) -> float:
        """Weights one forward over `tokens` tokens reads from memory: every dense weight and
        the output head once, the embedding rows not at all (a lookup), and for MoE the
        experts the tokens route to, expected over uniform top-k routing:
        E * (1 - (1 - k/E)^tokens) distinct experts per layer."""
        streamed = self.layers * self.dense_layer_params + self.head_params + self.extra_params
        if self.is_moe:
            untouched = (1 - self.experts_per_token / self.experts) ** max(tokens, 0.0)
            streamed += self.layers * self.experts * (1 - untouched) * self.expert_params
        return float(streamed)

    def flops_per_token(self, context: float) -> float:
        """Forward FLOPs of one token attending to `context` earlier tokens: 2 per active
        matmul weight (the embedding lookup is free) plus QK^T and AV (2 * 2 * context *
        heads * head_dim per layer)."""
        matmul = self.active_params - self.embedding_params
        attention = 4 * self.layers * self.heads * self.head_dim * context
        return 2.0 * matmul + attention


def eagle3_head(target: ModelShape, draft_vocab: int = 32000) -> ModelShape:
    """An EAGLE-3 draft head for `target`: one decoder layer of the target's shape (dense
    MLP of the target's width, or of its expert width times top-k for MoE targets), the fc
    that fuses three captured hidden states (3h x h), and its own output head over a reduced
    draft vocabulary; it reuses the target's embedding (looked up, not streamed)."""
    width = target.intermediate or target.moe_intermediate * target.experts_per_token
    return ModelShape(
        name=f"eagle3-head({target.name})",
        layers=1,
        hidden=target.hidden,
        heads=target.heads,
        kv_heads=target.kv_heads,
        head_dim=target.head_dim,
        intermediate=width,
        vocab=min(draft_vocab, target.vocab),
        tied_embeddings=True,
        extra_params=3 * target.hidden * target.hidden,
        source="EAGLE-3 (arXiv 2503.01840): one layer, fc over 3 fused hidden states, draft vocab",
    )


_QWEN3 = {"vocab": 151936, "head_dim": 128}


def _zoo_models() -> tuple[ModelShape, ModelShape]:
    """The CPU testbed's target and external draft, read off the zoo's own spec (what
    calibration runs on)."""
    from specrl.zoo import tokenizer
    from specrl.zoo.build import ZooSpec

    z = ZooSpec()
    target = ModelShape(
        name="zoo-target",
        layers=z.num_layers,
        hidden=z.hidden_size,
        heads=z.num_heads,
        kv_heads=z.num_kv_heads,
        head_dim=z.head_dim,
        intermediate=z.intermediate_size,
        vocab=tokenizer.VOCAB_SIZE,
        tied_embeddings=True,
        source="services/specrl/zoo/build.py (ZooSpec)",
    )
    source = f"{target.source}: the external draft"
    draft = target.model_copy(update={"name": "zoo-draft", "layers": z.draft_layers, "source": source})
    return target, draft


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape(
            name="qwen3-0.6b",
            layers=28,
            hidden=1024,
            heads=16,
            kv_heads=8,
            intermediate=3072,
            tied_embeddings=True,
            source="https://huggingface.co/Qwen/Qwen3-0.6B/blob/main/config.json",
            **_QWEN3,
        ),
        ModelShape(
            name="qwen3-8b",
            layers=36,
            hidden=4096,
            heads=32,
            kv_heads=8,
            intermediate=12288,
            source="https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json",
            **_QWEN3,
        ),
        ModelShape(
            name="qwen3-32b",
            layers=64,
            hidden=5120,
            heads=64,
            kv_heads=8,
            intermediate=25600,
            source="https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json",
            **_QWEN3,
        ),
        ModelShape(
            name="qwen3-30b-a3b",
            layers=48,
            hidden=2048,
            heads=32,
            kv_heads=4,
            experts=128,
            experts_per_token=8,
            moe_intermediate=768,
            source="https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
            **_QWEN3,
        ),
        ModelShape(
            name="qwen3-235b-a22b",
            layers=94,
            hidden=4096,
            heads=64,
            kv_heads=4,
            experts=128,
            experts_per_token=8,
            moe_intermediate=1536,
            source="https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json",
            **_QWEN3,
        ),
        *_zoo_models(),
    )
}


def get_model(name: str) -> ModelShape:
    """The table's entry for `name` (case-insensitive), or an error listing the known ones."""
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise unknown("model", name, MODELS) from None
