"""The history drafter (speculation method `history`, specrl.rollout.history) as a vLLM
proposer: vLLM's extension point for proposers of one's own (speculative_config method
`custom_class`, the class named by its import path), no fork or patch of vLLM. vLLM
verifies its drafts like n-gram's (deterministic drafts, rejection sampling): lossless.

vLLM hands a custom proposer the batch's token ids only; which request a row is and where
its prompt ends come from the model runner, which the worker extension attaches after
the engine starts (`SpecrlWorkerExtension.specrl_attach_history`, with the history's
settings). A prompt is known by a hash of its token ids, so a prompt that comes back (the
next epoch, or the n samples of one request, which vLLM runs as n requests) finds its
history on this replica.
"""

from __future__ import annotations

import hashlib
from typing import Any

from specrl.rollout.history import HistoryIndex

PROPOSER = f"{__name__}.HistoryProposer"


class HistoryProposer:
    def __init__(self, vllm_config: Any) -> None:
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.index = HistoryIndex()
        self.runner: Any = None  # the model runner, once attached
        self._requests: dict[str, tuple[bytes, int, int]] = {}  # req id -> key, sequence, tokens seen

    def attach(self, runner: Any, settings: dict) -> None:
        self.runner = runner
        self.index = HistoryIndex(**settings)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        pass  # no model

    def propose(
        self, sampled_token_ids: list[list[int]], num_tokens_no_spec, token_ids_cpu, slot_mappings=None
    ) -> list[list[int]]:
        if self.runner is None:
            return [[] for _ in sampled_token_ids]
        batch = self.runner.input_batch
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            req_id = batch.req_ids[i] if i < len(batch.req_ids) else None
            if req_id is None or not len(sampled):  # a partial prefill: nothing to follow yet
                drafts.append([])
                continue
            n = int(num_tokens_no_spec[i])
            key, seq, seen = self._requests.get(req_id) or self._start(req_id, i, token_ids_cpu)
            if n > seen:
                self.index.extend(key, seq, token_ids_cpu[i, seen:n].tolist())
            self._requests[req_id] = (key, seq, n)
            k = min(self.k, self.max_model_len - n - 1)
            context = token_ids_cpu[i, max(0, n - self.index.max_depth) : n].tolist()
            drafts.append(self.index.propose(key, seq, context, k))
        for req_id in self._requests.keys() - batch.req_id_to_index.keys():  # ended
            key, seq, _ = self._requests.pop(req_id)
            self.index.finish(key, seq)
        return drafts

    def _start(self, req_id: str, row: int, token_ids_cpu) -> tuple[bytes, int, int]:
        index = self.runner.input_batch.req_id_to_index[req_id]
        prompt_len = int(self.runner.input_batch.num_prompt_tokens[index])
        prompt = token_ids_cpu[row, :prompt_len]
        key = hashlib.blake2b(prompt.tobytes(), digest_size=16).digest()
        return key, self.index.start(key, prompt.tolist()), prompt_len
