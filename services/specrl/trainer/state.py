"""What the trainer owns between steps, built from `TrainerConfig` in a fixed order: the
model (loaded, then parallelized), its frozen reference (when the loss reads one), the
loss, the hidden-state capturer, the optimizer and the step count the learning-rate
schedule follows. The work on it is done by functions elsewhere (`logprobs.logprobs`,
`step.train_step`, `checkpoint.save` / `load`).

Every rank builds the same state from the same config; each holds its shard of the
parallel layout.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from specrl.config import TrainerConfig
from specrl.trainer.capture import Capturer
from specrl.trainer.losses import Loss, build_loss
from specrl.trainer.model import load_model
from specrl.trainer.optim import build_optimizer, learning_rate
from specrl.trainer.parallel import ParallelDims, parallelize


@dataclass
class TrainState:
    cfg: TrainerConfig  # what it was built from (checkpoints record it)
    device: torch.device
    dims: ParallelDims
    model: nn.Module
    reference: nn.Module | None  # frozen copy of the initial policy
    loss: Loss
    capturer: Capturer | None  # on TP rank 0 only: TP ranks hold identical activations
    optimizer: torch.optim.Optimizer
    step_count: int = 0  # optimizer steps taken = the policy version

    @classmethod
    def build(cls, cfg: TrainerConfig, device: torch.device | None = None) -> TrainState:
        device = device or torch.device("cpu")
        torch.manual_seed(cfg.seed)
        model = load_model(cfg.model, dtype=cfg.dtype, device=device)
        loss = build_loss(cfg.loss, cfg.grpo)
        # copied before parallelize: the reference gets the same layout applied separately
        reference = copy.deepcopy(model).eval().requires_grad_(False) if loss.uses_reference else None
        dims = ParallelDims.build(tp=cfg.tp, dp=cfg.dp, device_type=device.type)
        for m in filter(None, (model, reference)):
            parallelize(m, dims)
        capturer = None
        if cfg.capture.enabled and dims.tp_rank == 0:
            capturer = Capturer(cfg.capture, model.config.num_hidden_layers, cfg.seed)
        optimizer = build_optimizer(model.parameters(), cfg.optim)
        return cls(cfg, device, dims, model, reference, loss, capturer, optimizer)

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    def learning_rate(self) -> float:
        """The learning rate of the next optimizer step."""
        return learning_rate(self.cfg.optim, self.step_count)

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
