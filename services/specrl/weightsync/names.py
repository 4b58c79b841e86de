"""Parameter names across the wire.

Updates travel in checkpoint names: the names in the engine's own safetensors files,
which is exactly what the engine's loader (vLLM's `load_weights`) accepts. Senders
translate into them (`to_checkpoint_name`); receivers check a manifest against the
checkpoint they serve (`checkpoint_tensors`), so an unknown or misshapen tensor is
refused before a byte moves.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Module wrappers that training frameworks put into parameter names.
_WRAPPERS = re.compile(r"(^|\.)(_orig_mod|module|_fsdp_wrapped_module|_checkpoint_wrapped_module)\.")

# EAGLE-3 drafts: `speculators` and specrl's head call the decoder layer `layers.0`
# or `midlayer`; vLLM's checkpoints say `midlayer`. The token embedding is the target's
# (shared, frozen) and `t2d` is ignored by the engines, so neither is sent.
_DRAFT_RENAMES = ((re.compile(r"^(model\.)?layers\.0\."), "midlayer."), (re.compile(r"^model\."), ""))
_DRAFT_NOT_SENT = re.compile(r"(^|\.)(embed|embed_tokens)\.weight$|(^|\.)t2d$")


def to_checkpoint_name(kind: str, name: str, *, eagle3: bool = False) -> str | None:
    """A trainer's (HF) or draft-trainer's parameter name -> the engine checkpoint's name;
    None for a tensor that is not sent."""
    name = _WRAPPERS.sub(r"\1", name)
    if kind == "draft" and eagle3:
        if _DRAFT_NOT_SENT.search(name):
            return None
        for pattern, repl in _DRAFT_RENAMES:
            name = pattern.sub(repl, name, count=1)
    return name


@dataclass(frozen=True)
class Expected:
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype code, e.g. F32, BF16, I64


_ST_FLOATS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_ST_TO_TORCH = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_ST_TO_TORCH |= {"I64": "int64", "I32": "int32", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


def dtype_compatible(expected: str, sent: str) -> bool:
    """Floating tensors may change precision on the way (the loader casts); others not."""
    if expected in _ST_FLOATS:
        return sent in ("float64", "float32", "float16", "bfloat16")
    return _ST_TO_TORCH.get(expected) == sent


def checkpoint_dir(ref: str) -> Path:
    """Local directory of a model reference: a path, or a hub id already in the local
    HF cache (the engine downloaded it at startup)."""
    p = Path(ref)
    if p.is_dir():
        return p
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(ref, local_files_only=True, allow_patterns=["*.json", "*.safetensors"]))


def checkpoint_tensors(ref: str, *, skip: tuple[str, ...] = ()) -> dict[str, Expected]:
    """Names, shapes and dtypes of every tensor in a safetensors checkpoint (headers only,
    no tensor data is read)."""
    from safetensors import safe_open

    directory = checkpoint_dir(ref)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    out: dict[str, Expected] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                if any(re.search(s, key) for s in skip):
                    continue
                sl = st.get_slice(key)
                out[key] = Expected(tuple(sl.get_shape()), sl.get_dtype())
    return out
