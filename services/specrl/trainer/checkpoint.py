"""Checkpoint and resume of the trainer: model and optimizer state (sharded, with
torch.distributed.checkpoint, so every parallel layout saves and loads the same way),
RNG, step and policy version; plus an HF export (safetensors + config + tokenizer) that
vLLM and transformers load directly.

Layout of a checkpoint directory:
  state/       DCP shards of {"model", "optim"}
  hf/          model.safetensors, config.json, tokenizer files (rank 0)
  rng-R.pt     each rank's torch RNG (and capture sampler) state
  meta.json    step, policy version, trainer config (written last)

A save never overwrites a checkpoint in place (see `save`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from specrl.config import resolve_model_path
from specrl.trainer.state import TrainState


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def save(policy: TrainState, directory: str | Path, *, policy_version: int | None = None) -> Path:
    """Collective: every rank calls it. Returns the directory. The checkpoint is written
    beside it (DIR.partial) and renamed into place, so a process killed during a save
    leaves the previous checkpoint loadable."""
    out = Path(directory)
    partial = out.with_name(out.name + ".partial")
    if _rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)  # what a killed save left behind
        partial.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(policy.model, policy.optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(partial / "state"))
    full = policy.full_state(keep=_rank() == 0)  # collective gather of sharded parameters
    rng = {"torch": torch.get_rng_state()}
    if policy.capturer is not None:
        rng["capture"] = policy.capturer.generator_state()
    torch.save(rng, partial / f"rng-{_rank()}.pt")
    if _rank() == 0:
        _export_hf(policy, full, partial / "hf")
        meta = {
            "step": policy.step_count,
            "policy_version": policy.step_count if policy_version is None else policy_version,
            "config": policy.cfg.model_dump(mode="json"),
        }
        (partial / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")  # written last
    _barrier()
    if _rank() == 0:
        _replace(partial, out)
    _barrier()
    return out


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _previous(out: Path) -> Path:
    return out.with_name(out.name + ".old")


def _replace(new: Path, out: Path) -> None:
    """Swap a complete checkpoint into place: two renames, with the previous one kept as
    DIR.old in between (a kill there leaves it for `load`)."""
    old = _previous(out)
    if out.exists():  # else DIR.old may be the only complete checkpoint: kept until now
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    new.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _export_hf(policy: TrainState, state: dict[str, torch.Tensor], hf: Path) -> None:
    from safetensors.torch import save_file

    hf.mkdir(parents=True, exist_ok=True)
    policy.model.config.save_pretrained(str(hf))
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(hf / "model.safetensors"),
        metadata={"format": "pt"},
    )
    source = Path(resolve_model_path(policy.cfg.model))
    for f in source.glob("tokenizer*"):
        shutil.copy(f, hf / f.name)
    for name in ("generation_config.json", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, hf / name)


def find(directory: str | Path) -> Path | None:
    """The complete checkpoint saved at `directory`: itself, or DIR.old when a save was
    killed between its two renames; None when there is none."""
    src = Path(directory)
    for candidate in (src, _previous(src)):
        if (candidate / "meta.json").exists():
            return candidate
    return None


def read_meta(checkpoint: Path) -> dict:
    """A checkpoint's meta.json (step, policy version, trainer config)."""
    return json.loads((checkpoint / "meta.json").read_text())


def load(policy: TrainState, directory: str | Path) -> dict:
    """Collective: restore a checkpoint saved by `save` into a policy built with the same
    configuration (any parallel layout). Returns its meta."""
    src = find(directory)
    if src is None:
        raise FileNotFoundError(f"{directory} is not a specrl trainer checkpoint (no meta.json)")
    meta = read_meta(src)
    model_sd, optim_sd = get_state_dict(policy.model, policy.optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(src / "state"))
    set_state_dict(
        policy.model, policy.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    rng_path = src / f"rng-{_rank()}.pt"
    if rng_path.exists():
        rng = torch.load(rng_path, weights_only=False)
        torch.set_rng_state(rng["torch"])
        if policy.capturer is not None and "capture" in rng:
            policy.capturer.set_generator_state(rng["capture"])
    policy.step_count = meta["step"]
    return meta
