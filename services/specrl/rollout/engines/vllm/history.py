"""The history drafter (speculation method `history`, specrl.rollout.history) as a vLLM
proposer: vLLM's extension point for proposers of one's own (speculative_config method
`custom_class`, the class named by its import path), no fork or patch of vLLM. vLLM
verifies its drafts like n-gram's (deterministic drafts, rejection sampling): lossless.

vLLM hands a custom proposer the batch's token ids only; which request a row is, and its
prompt, come from the model runner's input batch, whose requests are watched joining and
leaving it from when the worker extension attaches the runner, after the engine starts
and before it serves (`SpecrlWorkerExtension.specrl_attach_history`, with the history's
settings; a batch vLLM builds anew later is watched as it is first read). A prompt is
known by a hash of its token ids, so a prompt that comes back (the next epoch, or the n
samples of one request, which vLLM runs as n requests) finds its history on this replica.

Hybrid with a draft model (`speculation.history.hybrid`, method eagle3 or draft_model):
the model runner keeps the draft model as its proposer, and the worker extension wraps
the runner's `propose_draft_token_ids` (`install_hybrid`). Each step, history drafts
every row first; a row's history draft is a candidate where its context agrees with
history's over `min_match` tokens at least and it drafts `min_draft` tokens at least,
and a candidate is taken where history's drafts have agreed with the policy's samples on
that request at least as well as the draft model's lately (specrl.rollout.hybrid: both
sources' drafts are scored every step, verified or not). When history's drafts alone are
expected to give more tokens per second (their expected accepted tokens, position by
position as SourceScores.position_acceptance has them, none for a row without a
candidate, over the step's time without the draft model's k - 1 positions, against the
source each row takes over the step's time with them, both times measured: StepCosts,
the first pass's in every step that runs one (FirstForward);
each path's time outside the draft model at the tokens it verifies, where that cost is
fitted, its slope resolved or not: VerifyCost), the draft model runs its first pass only
(over the tokens just verified, which keeps its KV cache current), and only over the rows
that do not take history's draft and the requests on their first step (the pass over
their prompts): the rows taking it are left out (drafter_rows.py), their caches stale
over such steps as for `hybrid_leave_out_after` below. Where no row is left in the pass
none runs and the step costs about what history alone does; such steps are timed as a
path of their own (StepCosts `no_pass`), apart from the steps whose pass runs (RL-Zero
epoch 1, c=4 on the CPU testbed: the draft model's call 0.2 ms against 2.9 ms with a
pass, logged ad hoc). Every REMEASURE_EVERY such steps in a row it drafts once more, to
be scored again. Otherwise the draft model drafts every row and the rows that
take history get history's tokens first and the model's after them. History may draft
past the draft model's k (`history.hybrid_max_draft`: the engine is built for the longer
draft, the model asked for its own k): where a request repeats its history, a step then
emits more tokens than the model's sequential positions could, at the price of verifying
them, which a large batch pays for. Each row's draft reaches as far as its positions
pay: position j is accepted with the probability that history's drafts on the request
start right and that the replica's drafts kept position j once they reached it
(SourceScores.position_acceptance), and costs one more verified token, whose seconds are
fitted to the steps as they run (VerifyCost, where the slope is resolved); the step's
expected tokens per second decide (draft_lengths).
A row the draft model drafts in full gets history's tokens after the model's
(`HistoryProposer.propose_after`: where history continues the request's tokens and the
model's draft), as far as they pay by the same choice: such a position is accepted only
where the model's k all were (its per-token rate to the power k), then as often as the
replica's extensions kept that position once they reached it
(SourceScores.extension_acceptance). That is where history adds to a strong draft model
it does not beat on its own (RL-Think on the CPU testbed, c=4: EAGLE-3's 3 tokens give
~3.4 tokens a step, the hybrid with extensions ~5 from a run's second epoch,
docs/draft.md). A row whose last extension had a token accepted counts as drafting from
history for the replica's idle share (the padded path cannot extend).
A request that has taken history's draft for `history.hybrid_leave_out_after` steps in a
row is left out of the draft model's passes (its rows cut from them: drafter_rows.py)
for as long as history keeps it, so the model's first pass and positions run over the
other rows only: the price the hybrid paid over history alone where history drafts most
rows (large batches of prompts that come back). Without a history draft, or once the
draft model's last score on it is better, the request is back in the passes, its draft
model's KV cache stale over the steps it was out (drafts worse there, never wrong). A
request whose history drafts have not been taken for `hybrid.QUIET_AFTER` steps in a row
is looked up in history (and both its drafts scored) only every `hybrid.PROBE_EVERY`
steps; its tokens still go into its prompt's tree every step, for its siblings. Requests
are of two kinds, each with its own replica-level scores and taken share
(`hybrid.ByKind`): recurring, whose prompt had finished responses when they began (an
earlier epoch's, or carried), and fresh (the prompt and its siblings only). Where few of
a kind's rows take history's drafts (`history.hybrid_idle_share`: a first epoch, new
prompts) a new request of that kind starts so, looked up on its first step. Where a
kind's rows that took history's drafts emitted fewer tokens a row than its rows the
draft model drafted, none of its rows takes history's drafts for a while
(`hybrid.Realized`: a request's own scores read history better by chance on some of many
requests; RL-Zero's first epoch, c=4 on the CPU testbed: 3.4-3.6 tokens a step against
EAGLE-3 alone's 3.7, 3.7 with it). In a step where no row took history's draft and every
row's kind is idle, the replica also runs the next `hybrid.IDLE_PADDED_STEPS` steps on
vLLM's padded drafter path (vLLM reads `disable_padded_drafter_batch` every step): the
draft model drafts alone, before bookkeeping, as EAGLE-3 alone does, history's trees
take those steps' tokens when their requests next draft or leave the batch
(`HistoryProposer._watch`), and the drafts offered in the unpadded step before them are
scored against the first one's (left unscored, a replica idle at every step never took
history's drafts again: a server kept across a run's epochs at c=64, RL-Zero on the CPU
testbed, used none after its first). RL-Zero epoch 0, c=16 on the testbed: the unpadded
path made the draft model's call ~12% longer, and ~1% fewer tokens a step were emitted
(docs/draft.md).

Lossless: specrl runs the draft model with vLLM's greedy draft sampling (its default), so
both drafts are deterministic functions of what the engine holds before the step (the
request's tokens so far; for a request back from being left out, also its draft model's
stale cache), and the choice between them is made from earlier steps' tokens only:
whichever fills a position, the rejection sampler verifies a deterministic draft, as for
n-gram. The wrapper refuses draft probabilities (probabilistic draft sampling), whose
rows would then no longer describe the draft. vLLM drafts after its bookkeeping then
(`disable_padded_drafter_batch`, which also turns async scheduling off), when the batch's
tokens are on the CPU and a step's drafts may be ragged lists.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specrl.rollout.engines.vllm.drafter_rows import DrafterRows
from specrl.rollout.history import HistoryIndex
from specrl.rollout.hybrid import (
    IDLE_PADDED_STEPS,
    REMEASURE_EVERY,
    ByKind,
    StepCosts,
    VerifyCost,
    draft_lengths,
    looks_up,
)

PROPOSER = f"{__name__}.HistoryProposer"


class HistoryProposer:
    def __init__(self, vllm_config: Any) -> None:
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.index = HistoryIndex()
        self.runner: Any = None  # the model runner, once attached
        self._watched: Any = None  # the input batch whose requests are watched (input_batch)
        self._requests: dict[str, _Request] = {}  # by request id
        self._recurring: set[str] = set()  # requests whose prompt had finished responses (kind)
        # hybrid: rows drafted by each source, steps the draft model ran its first pass only,
        # steps history drafted past the draft model's k (history.hybrid_max_draft), rows
        # left out of the draft model's passes, steps on vLLM's padded path (idle replica)
        self.rows = {
            "history": 0,
            "model": 0,
            "first_pass_only": 0,
            "long_drafts": 0,
            "left_out": 0,
            "padded": 0,
            "extended": 0,
        }

    def attach(self, runner: Any, settings: dict) -> None:
        """Draft for `runner` (before it serves: its requests are seen joining its batch)."""
        self.runner = runner
        self.index = HistoryIndex(**settings)
        runner.specrl_history = self  # the worker extension ages it on policy updates
        self.input_batch()

    def input_batch(self) -> Any:
        """The runner's input batch, watched (`_watch`). vLLM builds a new one where it
        re-initializes it (`may_reinitialize_input_batch`, as the KV cache is set up, before
        the attach); one replaced after the attach would report no request joining or
        leaving, and history would stop drafting without a word. So a batch is watched as
        it is first read here; a request that joined it unseen drafts nothing from history
        (and its tokens are not kept) until it ends."""
        batch = self.runner.input_batch
        if batch is not self._watched:
            self._watch(batch)
            self._watched = batch
        return batch

    def _watch(self, batch: Any) -> None:
        """A request is started when it joins vLLM's input batch (its kind known before it
        drafts), and its tokens go into its prompt's tree when it drafts (`propose`) and
        when its row leaves the batch, its response finished there if it ended. A step
        that drafts nothing from history (vLLM's padded path: an idle replica's) costs
        history nothing: extending the trees at every such step, from the sampled tokens,
        made the hybrid 3-5% slower than EAGLE-3 alone at RL-Zero's epoch 0, c=4 on the CPU
        testbed (0.08-0.13 ms of a 10 ms step, more in the steps around it; paired runs,
        docs/draft.md)."""
        add, remove = batch.add_request, batch.remove_request

        def add_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            if request.req_id not in self._requests:  # not a preempted request coming back
                self._requests[request.req_id] = self._start(request.req_id, request.prompt_token_ids)
            return add(request, *args, **kwargs)

        def remove_request(req_id: str, *args: Any, **kwargs: Any) -> Any:
            self._leaving(req_id)
            return remove(req_id, *args, **kwargs)

        batch.add_request, batch.remove_request = add_request, remove_request

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        pass  # no model

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec,
        token_ids_cpu,
        slot_mappings=None,
        k: int | None = None,
        min_depth: int = 0,
        skip: Collection[int] = (),
    ) -> list[list[int]]:
        """Each row's draft; `skip`: rows only extended, not looked up (no draft)."""
        if self.runner is None:
            return [[] for _ in sampled_token_ids]
        batch = self.input_batch()
        live = [
            i
            for i, sampled in enumerate(sampled_token_ids)
            # a partial prefill has nothing to follow yet; a request not seen joining, nothing kept
            if i < len(batch.req_ids) and len(sampled) and batch.req_ids[i] in self._requests
        ]
        for i in live:  # every row first: a row drafts from its siblings' latest tokens too
            self._catch_up(batch.req_ids[i], i, num_tokens_no_spec, token_ids_cpu)
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        for i in live:
            if i in skip:
                continue
            r = self._requests[batch.req_ids[i]]
            k_row = min(self.k if k is None else k, self.max_model_len - r.seen - 1)
            context = token_ids_cpu[i, max(0, r.seen - self.index.max_depth - 1) : r.seen]
            drafts[i] = self.index.propose(r.key, r.seq, context, r.seen - r.prompt_len, k_row, min_depth)
        return drafts

    def propose_after(self, req_id: str, row: int, draft: list[int], k: int, min_depth: int) -> list[int]:
        """Up to `k` tokens history drafts after `draft`, the draft model's for `req_id`'s
        next step (batch row `row`, caught up by `propose` this step): its context is the
        request's tokens and that draft ([] where the request is not kept)."""
        r = self._requests.get(req_id)
        if r is None:
            return []
        k = min(k, self.max_model_len - r.seen - len(draft) - 1)
        start = max(0, r.seen + len(draft) - self.index.max_depth - 1)
        tokens = self.input_batch().token_ids_cpu[row, start : r.seen]
        context = np.concatenate((tokens, draft), dtype=np.int32)
        return self.index.propose(r.key, r.seq, context, r.seen - r.prompt_len + len(draft), k, min_depth)

    def _catch_up(self, req_id: str, row: int, num_tokens, token_ids_cpu) -> None:
        """The tokens of `req_id` (batch row `row`) its tree does not hold yet go into it
        (the batch's int32 rows go to the native tree without a copy)."""
        r = self._requests[req_id]
        n = int(num_tokens[row])
        if n > r.seen:
            self.index.extend(r.key, r.seq, token_ids_cpu[row, r.seen : n])
            r.seen = n

    def _leaving(self, req_id: str) -> None:
        """`req_id`'s row leaves the batch (vLLM removes it; its row holds its tokens till
        then): its tokens are caught up, and where it ended (gone from the runner's
        requests; not preempted or unscheduled) its response is finished."""
        if req_id not in self._requests:
            return
        batch = self.runner.input_batch
        row = batch.req_id_to_index.get(req_id)
        if row is not None:
            self._catch_up(req_id, row, batch.num_tokens_no_spec, batch.token_ids_cpu)
        if req_id not in self.runner.requests:
            r = self._requests.pop(req_id)
            self.index.finish(r.key, r.seq)
            self._recurring.discard(req_id)

    def kind(self, req_id: str) -> str:
        """ "recurring" where the request's prompt had finished responses when it began,
        else "fresh" (hybrid.KINDS)."""
        return "recurring" if req_id in self._recurring else "fresh"

    def emitted(self, sampled: Any) -> list[tuple[str, list[int], int]]:
        """What each request emitted in a step on vLLM's padded drafter path, before its
        bookkeeping, from `sampled` (the step's sampled tokens, -1 past those accepted):
        (its id, the tokens, its tokens now); a row vLLM discards (a partial prefill)
        emitted nothing."""
        batch = self.input_batch()
        discard = self.runner.discard_request_mask.np
        out = []
        for i, row in enumerate(sampled.tolist()):
            tokens = [t for t in row if t >= 0]
            if i < len(batch.req_ids) and not discard[i] and tokens:
                out.append((batch.req_ids[i], tokens, int(batch.num_tokens_no_spec[i]) + len(tokens)))
        return out

    def seed(self, prompt: list[int], responses: list[list[int]]) -> None:
        """Earlier responses to `prompt`, from elsewhere (Prompt.history), as finished
        responses of the policy being served."""
        key = prompt_key(prompt)
        for response in responses:
            seq = self.index.start(key, prompt)
            self.index.extend(key, seq, response)
            self.index.finish(key, seq)

    def _start(self, req_id: str, prompt: Any) -> _Request:
        key = prompt_key(prompt)
        if self.index.finished(key):
            self._recurring.add(req_id)
        return _Request(key, self.index.start(key, prompt), len(prompt), len(prompt))


@dataclass
class _Request:
    """A request the drafter keeps: its prompt's key, its response's sequence in that
    prompt's tree, where its response starts in its batch row and the tokens the index has
    been given (the row's first `seen`; its tree holds all but the newest)."""

    key: bytes
    seq: int
    prompt_len: int
    seen: int


def prompt_key(prompt: Any) -> bytes:
    """A prompt's identity: a hash of its token ids (a list or the batch's array row)."""
    return hashlib.blake2b(np.asarray(prompt, dtype=np.int64).tobytes(), digest_size=16).digest()


def _scheduled_for(scheduler_output: Any, k: int) -> Any:
    """`scheduler_output` asking the draft model for `k` positions (a copy where it asked
    for another number)."""
    if k == scheduler_output.num_spec_tokens_to_schedule:
        return scheduler_output
    scheduled = copy.copy(scheduler_output)
    scheduled.num_spec_tokens_to_schedule = k
    return scheduled


class FirstForward:
    """When the draft model's first forward of a call ended (its first pass, over the
    tokens just verified), through a forward hook on the drafter's model: a step where the
    draft model drafts its k positions times its first pass too, so the first pass's cost
    is known from every step that runs one, not only from steps of history alone. Timed
    from one such step only (a server's second, a pass over 27 new prompts: 14.8 ms; once
    timed in every step, such steps of 30-64 rows spent 6.5-6.6 ms in the draft model),
    the path stayed untaken, its average never corrected (RL-Zero epoch 1, c=64 on the
    CPU testbed, logged ad hoc: one step of history alone with a pass in 127, 62 of 137
    once timed so). Host time: on a GPU the forward's end is its launch's. A drafter
    without a torch model (none to hook) times nothing (`ended` stays None). The hook is
    on the model for a timed call only (`timing`): a module with a forward hook takes
    PyTorch's slower call path at every forward, and an idle replica's padded steps, the
    draft model's k forwards each, are then EAGLE-3 alone's (what that saves was not
    resolved: docs/draft.md, "Not done yet")."""

    def __init__(self, drafter: Any) -> None:
        self.ended: float | None = None
        model = getattr(drafter, "model", None)
        self._model = model if isinstance(model, torch.nn.Module) else None

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Time the first forward's end (`ended`) over the call inside."""
        self.ended = None
        hook = self._model.register_forward_hook(self._ended) if self._model is not None else None
        try:
            yield
        finally:
            if hook is not None:
                hook.remove()

    def _ended(self, *_: Any) -> None:
        if self.ended is None:
            self.ended = time.perf_counter()


def install_hybrid(
    runner: Any,
    settings: dict,
    min_draft: int,
    min_match: int,
    model_k: int | None = None,
    leave_out_after: int = 2,
    idle_share: float = 0.1,
    extend: bool = False,
) -> HistoryProposer:
    """Choose per request between history's draft and the draft model's (module docstring)
    in `runner`: history's is a candidate where it matches the context over `min_match`
    tokens at least and drafts `min_draft` tokens at least. The draft model drafts
    `model_k` positions at most (None: the engine's k), history as far as the engine's k
    (history.hybrid_max_draft): a step scheduled for fewer (k_schedule) shortens both
    alike. A request that took history's draft `leave_out_after` steps in a row leaves the
    draft model's passes while history keeps it (0: none does; EAGLE pathway only). Under
    `idle_share` of the rows taking history's draft, the replica is idle (hybrid.TakenShare).
    `extend`: the draft model's full drafts go on with history's tokens (module docstring)."""
    history = HistoryProposer(runner.vllm_config)
    model_k = history.k if model_k is None else model_k
    history.attach(runner, settings)
    # scores and taken shares per kind of request (hybrid.ByKind)
    scores, costs = ByKind(history.kind, idle_share), StepCosts()
    verify = VerifyCost()
    drafter = getattr(runner, "drafter", None)
    drafter_rows = DrafterRows(runner) if leave_out_after and DrafterRows.supported(drafter) else None
    first_forward = FirstForward(drafter)
    alone: dict[str, int] = {}  # per request: steps in a row it took history's draft
    quiet: dict[str, int] = {}  # per request: steps in a row it did not (looks_up)
    propose_model = runner.propose_draft_token_ids
    # vLLM's spec config, whose disable_padded_drafter_batch it reads every step (None: a
    # runner without one stays on the unpadded path)
    spec_config = getattr(runner, "speculative_config", None)
    padded_left = 0  # steps left on the padded path (an idle replica's)
    streak = 0  # steps in a row the draft model ran its first pass only
    returned_at: float | None = None  # when the last step's drafts were returned
    last: tuple[set[str], int, int] = (set(), 0, 0)  # the last step's requests, rows, tokens to verify
    drafted: dict[str, str] = {}  # per request: the source of its last unpadded step's draft
    extended_by: dict[str, int] = {}  # per request: the model's tokens its last step's extension followed

    def realize(req: str, emitted: Any) -> None:
        """What `req` emitted after its last unpadded step's draft, for its kind (Realized)."""
        source = drafted.pop(req, None)
        if source is not None:
            scores.realized[history.kind(req)].observe(source, len(emitted))

    def extension_paid(req: str, emitted: Any) -> bool:
        """Whether `req`'s last unpadded step's extension had a token accepted (the step
        emitted past the model's tokens and the one sampled after them)."""
        own = extended_by.pop(req, None)
        return own is not None and len(emitted) > own + 1

    def padded_step(scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any):
        """A step of an idle replica on vLLM's padded path: the draft model's drafts
        alone; the path goes back to unpadded once the last such step has drafted. The
        drafts offered in the unpadded step before it are scored against what the first
        such step emitted: unscored, history's would never be taken again on a replica
        idle at every step (a first epoch's), whatever a later epoch's history offers.
        History's trees take these steps' tokens when their requests next draft or leave
        the batch (HistoryProposer._watch)."""
        nonlocal padded_left, returned_at
        if drafted:  # the first padded step after an unpadded one
            rows = history.emitted(sampled_token_ids)
            for req, emitted, at in rows:
                scores.of(req).score(req, emitted, at)
                realize(req, emitted)
            if extended_by:  # extensions that paid in the unpadded step count for the idle share
                paid = {req for req, emitted, _ in rows if extension_paid(req, emitted)}
                scores.observe(paid, [req for req, _, _ in rows])
            drafted.clear()  # a row discarded here (a partial prefill) emitted nothing after its draft
            extended_by.clear()
        k = min(scheduler_output.num_spec_tokens_to_schedule, model_k)
        drafts = propose_model(_scheduled_for(scheduler_output, k), sampled_token_ids, *args, **kwargs)
        history.rows["padded"] += 1
        padded_left -= 1
        if padded_left <= 0:
            spec_config.disable_padded_drafter_batch = True
        returned_at = None  # the next step's time is not the unpadded path's
        return drafts

    def propose_draft_token_ids(scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any):
        nonlocal streak, returned_at, last, padded_left
        if not isinstance(sampled_token_ids, list):  # a tensor: the padded path (padded_step)
            return padded_step(scheduler_output, sampled_token_ids, *args, **kwargs)
        called_at = time.perf_counter()
        batch = history.input_batch()
        req_ids = batch.req_ids  # each row's request (a property of vLLM's batch: read once)
        # the step's time outside the drafters, where a request carried over from the last
        # (otherwise the engine may have idled in between: between a bench's rounds,
        # seconds that no step cost)
        carried = returned_at is not None and not last[0].isdisjoint(req_ids)
        rest_s = called_at - returned_at if carried else None
        k = min(scheduler_output.num_spec_tokens_to_schedule, model_k)  # the draft model's
        longest = k + history.k - model_k if k else 0  # history's, past the model's if allowed
        if rest_s is not None:
            verify.observe(rest_s, last[1], last[2])
        live = [i for i, sampled in enumerate(sampled_token_ids) if len(sampled)]
        # a request whose history drafts have not been taken for a while is looked up, and
        # its drafts offered for scoring, only now and then (hybrid.QUIET_AFTER); a new
        # one too where its kind's rows seldom take history's draft (TakenShare.idle)
        for i in live:
            quiet.setdefault(req_ids[i], scores.share(req_ids[i]).quiet_start())
        skip = {i for i in live if not looks_up(quiet[req_ids[i]])}
        found = history.propose(
            sampled_token_ids,
            batch.num_tokens_no_spec,
            batch.token_ids_cpu,
            k=longest,
            min_depth=min_match,
            skip=skip,
        )
        scores.retain(runner.requests.keys())
        for streaks in (alone, quiet):
            for req in streaks.keys() - runner.requests.keys():
                del streaks[req]
        at = {i: int(batch.num_tokens_no_spec[i]) for i in live}
        extended: set[int] = set()  # rows whose model draft history extends this step
        for i in live:
            scores.of(req_ids[i]).score(req_ids[i], sampled_token_ids[i], at[i])
            realize(req_ids[i], sampled_token_ids[i])
        paid = {i for i in live if extension_paid(req_ids[i], sampled_token_ids[i])}
        drafted.clear()  # a request not in this step emitted nothing after its draft
        extended_by.clear()
        candidates = {i for i in live if len(found[i]) >= min_draft and scores.open(req_ids[i])}
        chosen = [i for i in sorted(candidates) if scores.of(req_ids[i]).prefers_history(req_ids[i])]
        takes_history = set(chosen)
        # a request that took history's draft `leave_out_after` steps in a row is left out
        # of the draft model's passes while history keeps it (drafter_rows.py)
        left_out: set[int] = set()
        if drafter_rows is not None:
            left_out = {i for i in chosen if alone.get(req_ids[i], 0) >= leave_out_after}
        # tokens each row is expected to emit: without the model's positions, history's
        # draft or none (a row without a candidate emits its one sampled token); with them,
        # the draft of the source it takes (not the better of the two expectations: their
        # maximum is biased up, and a row left out of the model's passes gets history's
        # only; at c=64 from RL-Zero's epoch 1 on the CPU testbed, steps with the model's
        # positions were expected to emit 281 tokens and emitted 238, logged ad hoc).
        # History's, the whole draft it offers now (past the model's k where it does:
        # rows taking it draft that far on either path), position by
        # position (position_acceptance), not its last drafts' agreed tokens: one lucky
        # match of a prompt's span lifts those, and a step of history alone then emits
        # fewer tokens than the model would have (module docstring). Cut at the model's
        # k, the tokens both paths share were undercounted and the model's gain on the
        # other rows overweighted: at c=64 from RL-Zero's epoch 1 on the CPU testbed,
        # steps with the model's positions were expected to emit 202 tokens and emitted
        # 289, one of history alone 256 and 488
        accept = {
            i: scores.of(req).position_acceptance(req, "history", len(found[i]))
            for i in candidates
            for req in [req_ids[i]]
        }
        own = {i: sum(accept[i]) for i in candidates}
        model = {i: scores.of(req_ids[i]).expected(req_ids[i])["model"] for i in live}
        tokens_first_pass = sum(1 + own[i] for i in candidates) + len(live) - len(candidates)
        tokens_full = sum(1 + (own[i] if i in takes_history else m) for i, m in model.items())
        # each path's seconds outside the draft model at the tokens it verifies (history's
        # draft alone; or k a row, history's draft then the model's for the rows taking
        # it), where verification is fitted (its slope resolved or not: VerifyCost)
        fit = verify.fit(len(live)) if candidates else None  # needed where history drafts only
        verified = (sum(1 + len(found[i]) for i in candidates) + len(live) - len(candidates),
                    sum(1 + (max(len(found[i]), k) if i in takes_history else k) for i in live))  # fmt: skip
        rest = None if fit is None else (fit.at(verified[0]), fit.at(verified[1]))
        # in a step of history alone every row taking history's draft leaves the draft
        # model's first pass too, but for a request's first step (the pass over its
        # prompt, which a cache it comes back to needs): the pass runs over the other rows
        # only, and where there are none the step costs about what history alone does
        alone_out = left_out
        if drafter_rows is not None:
            alone_out = left_out | {i for i in candidates if req_ids[i] in alone}
        alone_path = "no_pass" if len(alone_out) == len(req_ids) else "first_pass"
        first_pass_only = (
            k > 0
            and bool(candidates - left_out)
            and streak < REMEASURE_EVERY
            and bool(scores.measured["model"])
            and costs.first_pass_pays(tokens_first_pass, tokens_full, rest, alone_path)
        )
        if first_pass_only:
            left_out = alone_out
        if drafter_rows is not None:
            drafter_rows.left_out = {req_ids[i] for i in left_out}
        path = alone_path if first_pass_only else "full"
        # how far each row that takes history's draft drafts: to the model's k, or past it
        # where the positions' expected acceptance pays for verifying them (draft_lengths)
        takes = sorted(candidates) if first_pass_only else chosen

        def lengths(rows: list[tuple[list[float], int, int]], alone: bool) -> list[int]:
            """draft_lengths on this step's path (history alone's, or the full one's)."""
            if fit is None or not fit.resolved:  # cost unknown: as far as history drafts, to be timed
                return draft_lengths(rows, 1.0, 1.0, 0.0)
            seconds = fit.at(verified[0 if alone else 1]) + (costs.draft[path] or 0.0)
            tokens = tokens_first_pass if alone else tokens_full
            return draft_lengths(rows, tokens, seconds, fit.per_token)

        reach = {}  # row -> its draft's length, where history drafts past the model's k
        if longest > k and takes:
            # at the model's k: history's draft alone, or the model's k with history's first
            short = {i: min(len(found[i]), k) if first_pass_only else k for i in takes}
            rows = [(accept[i], short[i], len(found[i])) for i in takes]
            reach = dict(zip(takes, lengths(rows, first_pass_only)))
        found = [draft[: reach.get(i, k)] for i, draft in enumerate(found)]
        if first_pass_only:
            # every request drafts from history: the draft model runs its first pass only
            # (its KV cache kept current), not its k - 1 sequential forwards
            streak += 1
            first_pass = _scheduled_for(scheduler_output, 0)
            started = time.perf_counter()
            propose_model(first_pass, sampled_token_ids, *args, **kwargs)
            costs.observe(path, time.perf_counter() - started, rest_s)
            history.rows["history"] += len(candidates)
            history.rows["first_pass_only"] += 1
            for i in candidates:
                scores.of(req_ids[i]).offer(req_ids[i], "history", found[i], at[i])
            # ragged, as n-gram's: vLLM verifies each row's draft as long as it is; a row
            # without a candidate drafts nothing (as the expected tokens above count it)
            drafts = [found[i] if i in candidates else [] for i in range(len(found))]
        else:
            streak = 0
            scheduler_output = _scheduled_for(scheduler_output, k)
            started = time.perf_counter()
            with first_forward.timing():
                drafts = propose_model(scheduler_output, sampled_token_ids, *args, **kwargs)
            if len(left_out) < len(req_ids):  # a row the draft model's passes ran over
                costs.observe("full", time.perf_counter() - started, rest_s)
                if first_forward.ended is not None:  # its first pass, as history alone's (FirstForward)
                    costs.observe("first_pass", first_forward.ended - started, None)
            if runner._draft_probs is not None:
                raise RuntimeError(
                    "hybrid history drafting needs deterministic draft-model drafts (vLLM "
                    "draft_sample_method greedy); the engine produced draft probabilities"
                )
            drafts = drafts.tolist()  # ragged where history drafts past the draft model
            history.rows["history"] += len(chosen)
            history.rows["model"] += len(live) - len(chosen)
            # history's tokens after the model's draft, on the rows it drafts in full
            after = {}
            if extend and longest > k:
                for i in set(live) - takes_history - left_out - skip:
                    if len(drafts[i]) == k:
                        more = history.propose_after(req_ids[i], i, drafts[i], longest - k, min_match)
                        if more:
                            after[i] = more
            for i in set(live) - left_out - skip:  # a row left out has no draft of the model's
                row = drafts[i] + after.get(i, [])  # scored whole, drafted as far as it pays
                scores.of(req_ids[i]).offer(req_ids[i], "model", row, at[i], own=len(drafts[i]))
            for i in candidates:  # history's draft, the model's after it: what would be verified
                row = found[i] + (drafts[i][len(found[i]) :] if i not in left_out else [])
                scores.of(req_ids[i]).offer(req_ids[i], "history", row, at[i], own=len(found[i]))
                if i in takes_history:
                    drafts[i] = row
            if after:
                if fit is None:
                    fit = verify.fit(len(live))
                rows = sorted(after)
                ext_rows = []
                for i in rows:
                    accepted = scores.of(req_ids[i]).extension_acceptance(req_ids[i], k, len(after[i]))
                    ext_rows.append(([1.0] * k + accepted, k, k + len(after[i])))
                for i, m in zip(rows, lengths(ext_rows, False)):
                    if m > k:
                        drafts[i] = drafts[i] + after[i][: m - k]
                        extended.add(i)
                history.rows["extended"] += len(extended)
                extended_by.update((req_ids[i], k) for i in extended)
        history.rows["long_drafts"] += any(len(row) > k for row in drafts)  # past the model's k
        history.rows["left_out"] += len(left_out)
        took = candidates if first_pass_only else takes_history
        for i in live:
            if drafts[i]:
                drafted[req_ids[i]] = "history" if i in took else "model"
        # a row whose last extension had a token accepted drafted from history too: looked
        # up, and counted for the idle share (the padded path cannot extend). Counted when
        # drafted, extensions that seldom pay kept an idle replica off the padded path: at
        # RL-Zero's epoch 0, c=16 on the CPU testbed 25% of the rows extended, 3.84 tokens
        # a step against EAGLE-3 alone's 3.72, 0.85x its tokens per second (docs/draft.md)
        used = took | paid
        for i in live:
            req = req_ids[i]
            alone[req] = alone.get(req, 0) + 1 if i in took else 0
            quiet[req] = 0 if i in used else quiet[req] + 1
        scores.observe({req_ids[i] for i in used}, [req_ids[i] for i in live])
        if spec_config is not None and not used and scores.idle([req_ids[i] for i in live]):
            padded_left = IDLE_PADDED_STEPS  # the next steps on vLLM's padded path (module docstring)
            spec_config.disable_padded_drafter_batch = False
        last = set(req_ids), len(live), sum(1 + len(drafts[i]) for i in live)
        returned_at = time.perf_counter()
        return drafts

    runner.propose_draft_token_ids = propose_draft_token_ids
    return history
