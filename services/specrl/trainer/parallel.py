"""Parallelism applied to a plain HF causal LM from outside (torchtitan style): the model
code never changes. `ParallelDims` owns the [dp, tp] device mesh; `parallelize` applies
tensor parallel (`apply_tp`: Megatron split of attention and MLP projections with DTensor)
and then FSDP2 (`apply_fsdp`: `fully_shard` per decoder layer and at the root). Gloo on
CPU, NCCL on GPU. The gradient helpers the train step needs with these layouts (partial
TP gradients, the global norm over sharded gradients) live here too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor


@dataclass(frozen=True)
class ParallelDims:
    """The trainer's parallel layout: `tp` x `dp` ranks over the default process group,
    and the mesh whose axes are named "dp" and "tp" (None in a single process)."""

    tp: int
    dp: int
    mesh: DeviceMesh | None

    @classmethod
    def build(cls, *, tp: int, dp: int, device_type: str) -> ParallelDims:
        world = dist.get_world_size() if dist.is_initialized() else 1
        if tp * dp != world:
            raise ValueError(f"tp ({tp}) x dp ({dp}) must equal the number of ranks ({world})")
        mesh = init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp")) if world > 1 else None
        return cls(tp, dp, mesh)

    @property
    def dp_rank(self) -> int:
        return self.mesh["dp"].get_local_rank() if self.mesh is not None else 0

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        return self.mesh["dp"].get_group() if self.mesh is not None else None

    @property
    def tp_rank(self) -> int:
        return self.mesh["tp"].get_local_rank() if self.mesh is not None else 0


def parallelize(model: nn.Module, dims: ParallelDims) -> None:
    """Give `model` (in place) the layout `dims` describes, in this order:

    1. Tensor parallel first: it turns the projections' weights into DTensors sharded
       over the "tp" axis and installs the KV-head hooks; its plan needs plain
       parameters, so it cannot come after FSDP2.
    2. FSDP2 last: it shards whatever parameters it finds (plain, or TP's DTensors:
       2-D sharding) over the "dp" axis, each decoder layer as its own unit, then the
       root (embeddings, final norm, head).

    Activation checkpointing and compile, if they come, go between the two (torchtitan's
    order). The trainer applies the same layout to the policy and its frozen reference."""
    if dims.mesh is None:
        return
    if dims.tp > 1:
        apply_tp(model, dims.mesh["tp"])
    if dims.dp > 1:
        apply_fsdp(model, dims.mesh["dp"])


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a Qwen3 / Llama-style HF model."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model).__name__}: expected model.model.layers (Qwen3 / Llama architecture)")
    return layers


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Megatron split: q/k/v and gate/up column-parallel, o and down row-parallel, so each
    block needs one all-reduce in attention and one in the MLP. Embeddings, norms and the
    LM head stay replicated (the vocabularies specrl trains here are small; the logits
    are needed whole for logprobs and entropy).

    With fewer KV heads than TP ranks (the zoo target has 1; Qwen3-8B has 8, so TP=16
    would too), k/v cannot be split: as in Megatron, every rank keeps the whole k/v
    projections and uses the one KV head its query heads attend to (`_use_kv_head`);
    their gradients are then partial per rank and summed across the TP group."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = tp_mesh.size()
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    for what, n in (("num_attention_heads", heads), ("intermediate_size", cfg.intermediate_size)):
        if n % tp:
            raise ValueError(f"{what} ({n}) is not divisible by tp ({tp})")
    shard_kv = kv_heads % tp == 0
    if not shard_kv and tp % kv_heads:
        raise ValueError(f"num_key_value_heads ({kv_heads}) must divide tp ({tp}) or be divisible by it")
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    if shard_kv:
        plan |= {"self_attn.k_proj": ColwiseParallel(), "self_attn.v_proj": ColwiseParallel()}
    rank = tp_mesh.get_local_rank()
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, plan)
        if not shard_kv:
            # rank r holds query heads [r h/tp, (r+1) h/tp), all in KV head r kv/tp
            _use_kv_head(
                layer.self_attn, rank * kv_heads // tp, local_q_heads=heads // tp, group=tp_mesh.get_group()
            )
    model._specrl_tp_group = tp_mesh.get_group()
    model._specrl_tp_kv_replicated = not shard_kv


class _SumGradAcrossTP(torch.autograd.Function):
    """Identity forward; backward all-reduces the input gradient over the TP group
    (Megatron's "copy to tensor-parallel region"): each rank's gradient through a
    replicated k/v projection covers only its own query heads."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _use_kv_head(attn: nn.Module, index: int, *, local_q_heads: int, group: dist.ProcessGroup) -> None:
    """Make a replicated k/v projection produce only KV head `index` on this rank."""
    head_dim = attn.head_dim
    cut = slice(index * head_dim, (index + 1) * head_dim)
    for proj in (attn.k_proj, attn.v_proj):
        proj.register_forward_pre_hook(lambda _m, args: (_SumGradAcrossTP.apply(args[0], group), *args[1:]))
        proj.register_forward_hook(lambda _m, _args, out: out[..., cut])
    attn.num_key_value_groups = local_q_heads  # all local query heads share the one KV head


def tp_partial_grad_params(model: nn.Module) -> list[nn.Parameter]:
    """Replicated parameters each TP rank uses for its own heads only, so its gradient
    covers those heads and must be summed across ranks: Qwen3's per-head q/k norms, and
    k/v projections when KV heads are replicated."""
    suffixes = ("q_norm.weight", "k_norm.weight")
    if getattr(model, "_specrl_tp_kv_replicated", False):
        suffixes += tuple(f"{p}_proj.{w}" for p in "kv" for w in ("weight", "bias"))
    return [p for n, p in model.named_parameters() if n.endswith(suffixes)]


def sync_tp_partial_grads(model: nn.Module) -> None:
    group = getattr(model, "_specrl_tp_group", None)
    if group is None:
        return
    for p in tp_partial_grad_params(model):
        if p.grad is not None:
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(g, group=group)


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh) -> None:
    """FSDP2: shard every decoder layer, then the rest (embeddings, final norm, head)."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)


def clip_grad_norm(params: list[nn.Parameter], max_norm: float | None) -> float:
    """Global gradient norm over plain and DTensor (sharded) gradients; clips in place."""
    norms = []
    for p in params:
        if p.grad is None:
            continue
        n = torch.linalg.vector_norm(p.grad.float())
        norms.append(n.full_tensor() if isinstance(n, DTensor) else n)
    if not norms:
        return 0.0
    total = torch.linalg.vector_norm(torch.stack(norms)).item()
    if max_norm is not None and total > max_norm:
        coef = max_norm / (total + 1e-6)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return total
