"""Where a service computes: this process's GPU when there is one (torchrun's LOCAL_RANK
picks it), else the CPU. The trainer, the draft-trainer and `specrl draft init` share it,
so a pod given a GPU uses it without a setting."""

from __future__ import annotations

import os

import torch


def local_device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")
