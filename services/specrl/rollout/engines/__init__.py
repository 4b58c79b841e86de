"""Generation backends. The only place that knows which engine classes exist."""

from __future__ import annotations

from specrl.config import RolloutServerConfig
from specrl.rollout.engines.base import Engine


def create_engine(cfg: RolloutServerConfig) -> Engine:
    """Build the configured engine (imports it lazily: vLLM is heavy)."""
    if cfg.engine.kind == "vllm":
        from specrl.rollout.engines.vllm_engine import VllmEngine

        return VllmEngine(cfg.engine, cfg.speculation)
    raise ValueError(f"unknown engine kind {cfg.engine.kind!r}")
