"""The draft-trainer's core, no gRPC: a thread that reads the trainer's captured batches
and adapts the EAGLE-3 head on them (`OnlineDraftTrainer`), and the publishing of the
adapted head to the rollout servers through the draft weight-sync group.

Publishing is pulled, not pushed on a timer: the orchestrator asks for it (PushDraft)
when it pushes a policy, at the step boundary, so a draft update never lands in the
middle of a step's generation on its own schedule. A due draft (`publish_every` policy
versions since the last publish) is published only if its held-out acceptance estimate
is no worse than the published draft's on the same held-out batches (`publish_tolerance`):
online adaptation never swaps a strong draft for a worse one. Each draft version names
the policy version it was trained against; versions continue from what the replicas
serve, so a restarted draft-trainer never sends a version backwards.

Failure handling: a bad batch is refused and counted with the head untouched
(OnlineDraftTrainer); a broken stream (the trainer restarting) is retried with the head
kept; a failed publish leaves every replica on its last good draft.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import torch

from specrl.config import DraftTrainerServerConfig, resolve_model_path
from specrl.devices import local_device
from specrl.draft.eagle3 import Eagle3Config, Eagle3Head
from specrl.draft.online import DraftInputError, OnlineDraftTrainer, acceptance_length
from specrl.features import Captured
from specrl.metrics import DraftMetrics, WeightSenderMetrics
from specrl.trainer.api import CaptureStream, TrainerClient
from specrl.weightsync.names import checkpoint_dir
from specrl.weightsync.sender import WeightSender, WeightSyncError

log = logging.getLogger("specrl.draft")

RETRY_S = 2.0  # between attempts to (re)open the capture stream
META = "specrl_draft.json"  # next to a saved draft: its version and policy version


class DraftConfigError(ValueError):
    """The draft does not fit the target (vocabulary, width, layers)."""


def load_head(draft: str, target: str) -> Eagle3Head:
    """The EAGLE-3 head at `draft` with `target`'s (frozen) token embedding, after
    checking that the two agree; raises DraftConfigError naming the mismatch."""
    from safetensors import safe_open

    ddir, tdir = checkpoint_dir(resolve_model_path(draft)), checkpoint_dir(resolve_model_path(target))
    try:
        dcfg = Eagle3Config.from_hf_config(json.loads((ddir / "config.json").read_text()))
    except (OSError, KeyError, ValueError) as e:
        raise DraftConfigError(f"draft {draft}: not a usable EAGLE-3 config: {e}") from None
    tcfg = json.loads((tdir / "config.json").read_text())
    for key, want in (("vocab_size", dcfg.vocab_size), ("hidden_size", dcfg.hidden_size)):
        if tcfg.get(key) != want:
            raise DraftConfigError(f"draft {draft} has {key} {want}; target {target} has {tcfg.get(key)}")
    layers = tcfg.get("num_hidden_layers")
    if dcfg.target_num_layers != layers or max(dcfg.aux_layer_ids) >= layers:
        raise DraftConfigError(
            f"draft {draft} reads aux layers {list(dcfg.aux_layer_ids)} of a {dcfg.target_num_layers}-layer "
            f"target; target {target} has {layers} layers"
        )
    embed = None
    for f in sorted(tdir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            key = next((k for k in st.keys() if k.endswith("embed_tokens.weight")), None)  # noqa: SIM118
            if key is not None:
                embed = st.get_tensor(key).float()
                break
    if embed is None:
        raise DraftConfigError(f"target {target}: no embed_tokens.weight in its safetensors")
    try:
        return Eagle3Head.load(ddir, embed)
    except (OSError, ValueError) as e:  # weights missing or misnamed, a bad draft vocabulary
        raise DraftConfigError(f"draft {draft}: {e}") from None


@dataclass
class Published:
    """The draft the replicas serve: version 0 is the initial draft they loaded."""

    version: int = 0
    policy_version: int = -1
    state: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class DraftPush:
    version: int
    policy_version: int
    updated: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    held_back: str = ""
    acceptance_estimate: float = 0.0
    candidate_estimate: float = 0.0


class DraftTrainerCore:
    def __init__(
        self,
        cfg: DraftTrainerServerConfig,
        *,
        metrics: DraftMetrics | None = None,
        sender_metrics: WeightSenderMetrics | None = None,
    ) -> None:
        if not cfg.trainer or not cfg.draft:
            raise DraftConfigError("the draft-trainer needs `trainer` (an address) and `draft` (a model)")
        self.cfg = cfg
        self.metrics = metrics
        self.trainer = TrainerClient(cfg.trainer, timeout=60)
        self.target = cfg.target or self._trainer_model()
        resumed = self._saved()
        self.device = local_device()
        head = load_head(cfg.save_dir if resumed else cfg.draft, self.target).to(self.device)
        self._scratch = copy.deepcopy(head).eval()  # holds the published draft for comparison
        self.online = OnlineDraftTrainer(head, cfg.training)
        self.published = Published(state=self._snapshot())
        self.sender = WeightSender(
            cfg.weight_sync, eagle3_draft=True, metrics=sender_metrics, device=self.device
        )
        if resumed:  # the replicas may serve it already; joining ones are caught up to it
            pub = self.published
            pub.version, pub.policy_version = resumed["version"], resumed["policy_version"]
            self.sender.set_current(pub.version, lambda: pub.state.items(), policy_version=pub.policy_version)
            self.online.stats.policy_version = pub.policy_version
            log.info("draft-trainer: resumed draft v%d from %s", pub.version, cfg.save_dir)
        self.estimate = 0.0  # of the published draft, as last evaluated
        self.agreement: list[float] = []
        self.streaming = False
        self.detail = "not started"
        self._lock = threading.Lock()  # the head and optimizer: training vs publishing
        self._push_lock = threading.Lock()  # one publish at a time
        self._stop = threading.Event()
        self._stream: CaptureStream | None = None
        self._thread = threading.Thread(target=self._consume, name="specrl-draft-consume", daemon=True)
        log.info(
            "draft-trainer: draft %s on target %s (aux layers %s) on %s, trainer %s",
            cfg.draft, self.target, list(head.cfg.aux_layer_ids), self.device, cfg.trainer,
        )  # fmt: skip

    def _trainer_model(self) -> str:
        try:
            return self.trainer.status().model
        except grpc.RpcError as e:
            raise DraftConfigError(
                f"the trainer at {self.cfg.trainer} does not answer ({e.code().name}) to say which target "
                "it trains; start it first or give `target`"
            ) from None

    # -- training -----------------------------------------------------------------

    def start(self) -> DraftTrainerCore:
        self._thread.start()
        return self

    def _consume(self) -> None:
        """Train on every captured batch; reopen the stream when it breaks (the trainer
        restarting), keeping the head."""
        while not self._stop.is_set():
            try:
                self._stream = self.trainer.captures()
                self.streaming, self.detail = True, "reading captures"
                for message in self._stream:
                    self._train(Captured.from_message(message))
                    if self._stop.is_set():
                        return
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                self.streaming, self.detail = False, f"capture stream: {e.code().name}: {e.details()}"
                log.warning("%s; retrying in %.0f s", self.detail, RETRY_S)
                self._stop.wait(RETRY_S)
            except ValueError as e:  # a message that does not decode: skipped like a bad batch
                self._refused(f"undecodable captured batch: {e}")

    def _train(self, batch: Captured) -> None:
        with self._lock:
            try:
                trained = self.online.submit(batch)
            except DraftInputError as e:  # counted by the trainer core
                log.error("captured batch of policy v%d refused: %s", batch.policy_version, e)
                if self.metrics:
                    self.metrics.refused.inc()
                return
            except Exception as e:  # a failure the checks did not foresee must not stop training
                log.exception("training on a batch of policy v%d failed", batch.policy_version)
                self.online.opt.zero_grad(set_to_none=True)
                self._refused(f"training failed: {type(e).__name__}: {e}", locked=True)
                return
        if trained and self.metrics:
            s, m = self.online.stats, self.metrics
            m.steps.inc()
            m.tokens.inc(int(batch.loss_mask.sum()))
            m.loss.set(s.last_loss)
            m.policy_version.set(s.policy_version)

    def _refused(self, reason: str, *, locked: bool = False) -> None:
        log.error("%s", reason)
        with contextlib.nullcontext() if locked else self._lock:
            self.online.stats.refused += 1
            self.online.stats.last_error = reason
        if self.metrics:
            self.metrics.refused.inc()

    # -- publishing ---------------------------------------------------------------

    def push(self, replicas: Sequence[str]) -> DraftPush:
        """Make `replicas` the draft group and publish the adapted draft if it is due and
        no worse than the published one; replicas joining (or behind) are caught up to
        the published draft."""
        with self._push_lock:
            t0 = time.perf_counter()
            joining = self.sender.follow(replicas)
            out = self._publish_if_due(replicas)
            sent, failed = self.sender.join(joining)  # after the publish: one send each
            out.updated += sent
            out.dropped |= failed
            out.seconds = time.perf_counter() - t0
            return out

    def _publish_if_due(self, replicas: Sequence[str]) -> DraftPush:
        pub = self.published
        with self._lock:
            s = self.online.stats
            due = s.steps > 0 and s.policy_version >= pub.policy_version + self.cfg.publish_every
            out = DraftPush(pub.version, pub.policy_version, acceptance_estimate=self.estimate)
            if not due:
                return out
            if not self.online.holdout:
                out.held_back = "no held-out batch yet to judge the draft by"
                return out
            candidate = self.online.evaluate()
            self._scratch.load_state_dict(pub.state, strict=False)
            current = self.online.evaluate(self._scratch)
            state, policy_version = self._snapshot(), s.policy_version
        new, old = acceptance_length(candidate), acceptance_length(current)
        self.agreement, self.estimate = candidate, old
        out.acceptance_estimate, out.candidate_estimate = old, new
        if self.metrics:
            for j, a in enumerate(candidate):
                self.metrics.agreement.labels(position=str(j)).set(a)
        if new < old - self.cfg.publish_tolerance:
            out.held_back = f"held-out acceptance estimate {new:.3f} below the published draft's {old:.3f}"
            log.info("draft v%d held back: %s", pub.version + 1, out.held_back)
            if self.metrics:
                self.metrics.held_back.inc()
                self.metrics.acceptance_estimate.set(old)
            return out
        # above whatever any replica serves: a restarted draft-trainer never goes back
        version = max([pub.version, *self.sender.served(replicas).values()]) + 1
        try:
            result = self.sender.push(version, lambda: state.items(), policy_version=policy_version)
        except WeightSyncError as e:
            out.held_back = f"publish failed: {e}"
            log.error("draft v%d: %s", version, out.held_back)
            return out
        self.published = Published(version, policy_version, state)
        self.estimate = new
        out.version, out.policy_version, out.acceptance_estimate = version, policy_version, new
        out.updated, out.dropped, out.bytes = list(result.members), dict(result.dropped), result.bytes
        out.phases = dict(result.phases)
        self._save(version, policy_version)
        if self.metrics:
            self.metrics.published_version.set(version)
            self.metrics.acceptance_estimate.set(new)
        log.info(
            "draft v%d (trained against policy v%d, acceptance estimate %.3f, was %.3f) -> %s",
            version, policy_version, new, old, out.updated,
        )  # fmt: skip
        return out

    def _snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of the head's weights under its own names (the sender translates them),
        without the target's embedding, which the engine shares with the target. A draft
        vocabulary's map (`d2t`) goes with every update: the engine's checkpoint has it,
        and the weights and the map they were trained under arrive together."""
        state = self.online.head.state_dict()
        return {n: p.detach().clone() for n, p in state.items() if n != "embed.weight"}

    def _saved(self) -> dict | None:
        """The draft a previous life of this service published last (save_dir)."""
        d = Path(self.cfg.save_dir) if self.cfg.save_dir else None
        if d is None or not (d / META).is_file():
            return None
        return json.loads((d / META).read_text())

    def _save(self, version: int, policy_version: int) -> None:
        """Write the published draft where vLLM (and a restarted draft-trainer) load it:
        weights first, then the version file that marks it complete."""
        if not self.cfg.save_dir:
            return
        out = Path(self.cfg.save_dir)
        (out / META).unlink(missing_ok=True)
        self._scratch.load_state_dict(self.published.state, strict=False)
        self._scratch.save(out)
        (out / META).write_text(json.dumps({"version": version, "policy_version": policy_version}))

    # -- status -------------------------------------------------------------------

    def status(self) -> dict:
        with self._lock:
            s = self.online.stats
            return {
                "draft": self.cfg.draft or "",
                "trainer": self.cfg.trainer or "",
                "steps": s.steps,
                "tokens": s.tokens,
                "refused": s.refused,
                "last_error": s.last_error,
                "last_loss": s.last_loss,
                "policy_version": s.policy_version,
                "agreement": list(self.agreement),
                "acceptance_estimate": self.estimate,
                "published_version": self.published.version,
                "published_policy_version": self.published.policy_version,
                "streaming": self.streaming,
                "detail": self.detail,
            }

    def stop(self) -> None:
        self._stop.set()
        if self._stream is not None:
            self._stream.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.sender.close()
        self.trainer.close()
