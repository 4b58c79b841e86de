"""SGLang adapter for weight sync. NOT TESTED: SGLang does not run on these machines
(no CPU build), and nothing in the test suite exercises it against a real server. It is
typed against SGLang 0.5.23's HTTP API (read from its released wheel):

  JoinWeightGroup    -> POST /init_weights_update_group {master_address, master_port,
                        rank_offset, world_size, group_name, backend}; each TP worker
                        joins as rank_offset + tp_rank, the sender is rank 0 and forms
                        the same group with SGLang's rendezvous (tcp:// init method).
                        Policy and draft use separate groups (group_name per kind); only
                        SGLang's target runner joins, the draft runner loads what it
                        receives.
  Begin              -> POST /pause_generation {mode} (default "abort": SGLang cannot
                        let in-flight requests finish on the old weights while holding
                        new ones back, so callers drain first, as specrl's orchestrator
                        does in synchronous mode), then POST /begin_weight_update
                        {selector: "target" | "draft"} (required since 0.5.23)
  broadcast + Commit -> POST /update_weights_from_distributed {names, dtypes, shapes,
                        group_name, flush_cache, weight_version, selector}, while the
                        sender broadcasts every tensor in `names` order (one broadcast
                        per tensor, SGLang's default format), then POST
                        /end_weight_update and /continue_generation
  Abort              -> POST /end_weight_update and /continue_generation (SGLang loads
                        only after receiving every tensor of a call)
The served version is `weight_version` in GET /model_info.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass

import requests
import torch
import torch.distributed as dist

from specrl.weightsync.manifest import dtype_name


class SGLangError(RuntimeError):
    pass


@dataclass
class SGLangReplica:
    """One SGLang server (HTTP base URL, e.g. http://10.0.0.5:30000)."""

    url: str
    timeout_s: float = 600.0

    def _post(self, path: str, body: dict | None = None) -> dict:
        r = requests.post(f"{self.url.rstrip('/')}{path}", json=body or {}, timeout=self.timeout_s)
        r.raise_for_status()
        out = r.json() if r.content else {}
        if isinstance(out, dict) and out.get("success") is False:
            raise SGLangError(f"{self.url}{path}: {out.get('message', 'failed')}")
        return out

    def init_group(
        self, *, host: str, port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        self._post(
            "/init_weights_update_group",
            {
                "master_address": host,
                "master_port": port,
                "rank_offset": rank_offset,
                "world_size": world_size,
                "group_name": group_name,
                "backend": backend,
            },
        )

    def destroy_group(self, group_name: str) -> None:
        self._post("/destroy_weights_update_group", {"group_name": group_name})

    def pause(self, mode: str = "abort") -> None:
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"SGLang pause mode must be abort, retract or in_place, got {mode!r}")
        self._post("/pause_generation", {"mode": mode})

    def resume(self) -> None:
        self._post("/continue_generation", {})

    def begin_update(self, kind: str) -> None:
        self._post("/begin_weight_update", {"selector": _selector(kind)})

    def end_update(self) -> None:
        self._post("/end_weight_update", {})

    def update_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        *,
        kind: str,
        group_name: str,
        version: int,
    ) -> None:
        """Blocks until SGLang has received and loaded every tensor: call it from a
        thread while the sender broadcasts."""
        self._post(
            "/update_weights_from_distributed",
            {
                "names": names,
                "dtypes": dtypes,
                "shapes": shapes,
                "group_name": group_name,
                "flush_cache": True,
                "weight_version": str(version),
                "selector": _selector(kind),
            },
        )

    def weight_version(self) -> str | None:
        r = requests.get(f"{self.url.rstrip('/')}/model_info", timeout=self.timeout_s)
        r.raise_for_status()
        return r.json().get("weight_version")


def _selector(kind: str) -> str:
    """specrl's weight kind -> SGLang's runner selector."""
    try:
        return {"policy": "target", "draft": "draft"}[kind]
    except KeyError:
        raise ValueError(f"weight kind must be policy or draft, got {kind!r}") from None


def sender_group(host: str, port: int, world_size: int, group_name: str, backend: str, timeout_s: float):
    """Rank 0 of a group that SGLang's `init_weights_update_group` members join: the
    same tcp:// rendezvous and group-name key prefix they use."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, size = next(dist.rendezvous(f"tcp://{host}:{port}", 0, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = dist.PrefixStore(group_name, store)
    pg, _ = dist.distributed_c10d._new_process_group_helper(
        size, rank, [], backend, store, group_name=group_name, timeout=timeout
    )
    return pg


def manifest_lists(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[str], list[str], list[list[int]]]:
    """SGLang's update manifest: parallel lists of names, dtype names and shapes."""
    names, dtypes, shapes = [], [], []
    for name, t in named:
        names.append(name)
        dtypes.append(dtype_name(t.dtype))
        shapes.append(list(t.shape))
    return names, dtypes, shapes


def broadcast_tensors(pg, named: Iterable[tuple[str, torch.Tensor]]) -> None:
    """One broadcast per tensor, in manifest order, as SGLang's receiver expects."""
    for _, t in named:
        dist.broadcast(t.detach().contiguous(), src=0, group=pg)
