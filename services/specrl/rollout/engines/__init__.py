"""Generation backends. The only place that knows which engine classes exist: every
entry point builds or runs an engine through these functions, which import the chosen
engine's subpackage lazily (vLLM is heavy)."""

from __future__ import annotations

from specrl.config import RolloutServerConfig
from specrl.rollout.engines.base import Engine


def create_engine(cfg: RolloutServerConfig) -> Engine:
    """Build the configured engine (node 0 of an engine spanning machines)."""
    if cfg.engine.kind == "vllm":
        from specrl.rollout.engines.vllm.engine import VllmEngine

        return VllmEngine(cfg.engine, cfg.speculation)
    raise ValueError(f"unknown engine kind {cfg.engine.kind!r}")


def serve_worker_node(cfg: RolloutServerConfig, node_rank: int) -> None:
    """Run node `node_rank` (> 0) of the configured engine spanning engine.nnodes
    machines until node 0 goes away. ValueError for a rank that is no worker node."""
    if cfg.engine.kind == "vllm":
        from specrl.rollout.engines.vllm.engine import serve_worker_node as serve_vllm_node

        serve_vllm_node(cfg, node_rank)
        return
    raise ValueError(f"unknown engine kind {cfg.engine.kind!r}")
