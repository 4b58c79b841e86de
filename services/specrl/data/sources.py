"""Prompts for the RL loop: the zoo's arithmetic task (generated from a seed), a file of
rows read with HF datasets, or a Hugging Face dataset from the local cache, so GSM8K,
MATH and DAPO-Math data work as they are published. Prompts are rendered and tokenized
here, once, with the policy's tokenizer (through its chat template for chat rows and
`data.chat`): the rollout servers and the trainer then see the same token ids. Each
row's reference answer is taken out of its answer field by the dataset's convention
(`rewards.reference_answer`).

Bad rows never stop a run: a row without the prompt or answer field, with an empty or
malformed prompt (a messages list that is not one, an unknown role), a template that
fails on it, an answer its format does not find, or a prompt that leaves no room for the
completion in the context is skipped and counted by reason (`skipped`). A source that
cannot be read, names a field it does not have, or has no usable row is an error before
anything starts.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specrl.config import DATA_FILE_FORMATS, DataConfig
from specrl.data.rewards import reference_answer

ROLES = ("system", "user", "assistant", "tool")


class DataError(ValueError):
    pass


@dataclass(frozen=True)
class Item:
    prompt: str  # as the policy sees it (rendered)
    answer: str  # the reference's final answer
    prompt_ids: list[int]
    reference: str = ""  # the answer field as the row has it


class PromptSource:
    """An endless, seeded stream of prompts; `position` items were taken so far (a
    resumed run skips that many)."""

    def __init__(self, cfg: DataConfig, tokenizer, *, max_prompt_tokens: int, position: int = 0) -> None:
        self.cfg = cfg
        self.tok = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.skipped: Counter[str] = Counter()
        self.position = 0
        if cfg.chat.enabled and not getattr(tokenizer, "chat_template", None):
            raise DataError("data.chat.enabled: the policy's tokenizer has no chat template")
        # a source is read now, so that an unreadable one fails before anything starts
        self._file_rows = [] if cfg.source == "task" else load_rows(cfg)
        # prompts go through the chat template: all of them, or the rows of messages
        self.uses_chat = cfg.chat.enabled or any(isinstance(p, list) for p, _ in self._file_rows[:1000])
        self._rows = self._task_rows() if cfg.source == "task" else self._cycle(self._file_rows)
        for _ in range(position):
            self.next()

    def batch(self, n: int) -> list[Item]:
        return [self.next() for _ in range(n)]

    def next(self) -> Item:
        for _ in range(10_000):
            prompt, answer = next(self._rows)
            item = self.item(prompt, answer)
            if item is not None:
                self.position += 1
                return item
        raise DataError(
            f"data.source {self.cfg.source}: 10000 rows in a row were unusable: {dict(self.skipped)}"
        )

    def head(self, n: int) -> list[tuple[object, object]]:
        """The source's first `n` raw (prompt, answer) rows, in its own order."""
        if self.cfg.source == "task":
            return list(itertools.islice(self._task_rows(), n))
        return self._file_rows[:n]

    def stop_token_ids(self) -> list[int]:
        """The tokens that end a sample: the tokenizer's end-of-sequence, and with chat
        prompts the template's end-of-turn (`<|im_end|>` for Qwen)."""
        eos = getattr(self.tok, "eos_token_id", None)
        ids = {eos} if isinstance(eos, int) else set()
        return sorted(ids | (set(end_of_turn_ids(self.tok)) if self.uses_chat else set()))

    def item(self, prompt: object, answer: object) -> Item | None:
        """One row as the policy sees it, or None (counted in `skipped` by reason)."""
        if prompt is None or answer is None:
            return self._skip("missing field")
        if isinstance(prompt, str):
            if not prompt.strip():
                return self._skip("empty prompt")
            text = self.cfg.template.replace("{prompt}", prompt)  # other braces stay as they are
            messages = [{"role": "user", "content": text}] if self.cfg.chat.enabled else None
        elif isinstance(prompt, list):
            messages, reason = _messages(prompt)
            if messages is None:
                return self._skip(reason)
        else:
            return self._skip("malformed prompt")
        reference = answer if isinstance(answer, str) else str(answer)
        final = reference_answer(reference, self.cfg.answer_format)
        if final is None:
            return self._skip("answer not found")
        if messages is not None:
            text = self._render(messages)
            if text is None:
                return self._skip("template failed")
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            return self._skip("prompt too long")
        return Item(text, final, ids, reference.strip())

    def _render(self, messages: list[dict]) -> str | None:
        if not getattr(self.tok, "chat_template", None):
            raise DataError(
                f"data.source {self.cfg.source}: rows hold chat messages but the policy's tokenizer "
                "has no chat template"
            )
        chat = self.cfg.chat
        if chat.system is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": chat.system}, *messages]
        try:
            text = self.tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, **chat.template_kwargs
            )
        except Exception:  # jinja raises its own errors (and the template may raise on purpose)
            return None
        return text

    def _skip(self, reason: str) -> None:
        self.skipped[reason] += 1
        return None

    def _task_rows(self) -> Iterator[tuple[object, object]]:
        from specrl.data import task

        c = self.cfg
        problems = task.generate(
            seed=c.seed,
            split="train",
            min_terms=c.task_min_terms,
            max_terms=c.task_max_terms,
            max_operand=c.task_max_operand,
        )
        rows = ((p.prompt, str(p.answer)) for p in problems)
        return rows if c.task_prompts is None else self._cycle(list(itertools.islice(rows, c.task_prompts)))

    def _cycle(self, rows: list[tuple[object, object]]) -> Iterator[tuple[object, object]]:
        """Epoch after epoch, each in a fresh seeded order (when shuffling)."""
        rng = random.Random(self.cfg.seed)
        while True:
            order = list(range(len(rows)))
            if self.cfg.shuffle:
                rng.shuffle(order)
            for i in order:
                yield rows[i]


def _messages(prompt: list) -> tuple[list[dict] | None, str]:
    """A row's chat messages as plain {role, content} dicts, or None and why not."""
    out = []
    for m in prompt:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("content"), str)
            or not isinstance(m.get("role"), str)
        ):
            return None, "malformed messages"
        if m["role"] not in ROLES:
            return None, "unknown role"
        out.append({"role": m["role"], "content": m["content"]})
    if not out or not any(m["content"].strip() for m in out):
        return None, "empty prompt"
    return out, ""


def end_of_turn_ids(tok) -> list[int]:
    """The token a chat template closes an assistant turn with (`<|im_end|>`, `<|eot_id|>`),
    found by rendering one turn: the special token right after the assistant's text. Empty
    when the template closes turns with plain text (then the end-of-sequence ends them)."""
    mark = "SPECRL_TURN_END_PROBE"
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": mark}]
    try:
        text = tok.apply_chat_template(turn, tokenize=False)
    except Exception:
        return []
    after = text.split(mark, 1)[1] if mark in text else ""
    ids = tok(after, add_special_tokens=False)["input_ids"][:1] if after else []
    special = set(getattr(tok, "all_special_ids", ())) | set(getattr(tok, "added_tokens_decoder", {}))
    return [i for i in ids if i in special]


def load_rows(cfg: DataConfig) -> list[tuple[object, object]]:
    """(prompt, answer) of every row of the file or hub dataset; a row lacking a field
    gives None there."""
    import datasets

    datasets.disable_progress_bars()
    if cfg.kind == "hub":
        ds = _load_hub(cfg)
    else:
        path = Path(cfg.source).expanduser()
        fmt = DATA_FILE_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise DataError(f"data.source {path}: unknown format (use {', '.join(DATA_FILE_FORMATS)})")
        try:
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
        except Exception as e:  # datasets raises many types for a malformed file
            raise DataError(f"data.source {path}: cannot read: {type(e).__name__}: {e}") from None
    columns = [_column(ds, cfg, key) for key in (cfg.prompt_key, cfg.answer_key)]
    rows = [(_field(p, cfg.prompt_key), _field(a, cfg.answer_key)) for p, a in zip(*columns)]
    if not rows:
        raise DataError(f"data.source {cfg.source}: no rows")
    return rows


def _load_hub(cfg: DataConfig):
    """A Hugging Face dataset from the local datasets cache only (no hub here, and a run
    must not depend on one): a clear error that says how to fetch it otherwise."""
    import datasets
    from datasets import config as ds_config

    offline = ds_config.HF_HUB_OFFLINE
    ds_config.HF_HUB_OFFLINE = True
    try:
        return datasets.load_dataset(cfg.source, cfg.subset, split=cfg.split)
    except Exception as e:  # not cached (ConnectionError, FileNotFoundError, ...), bad split
        subset = f", {cfg.subset!r}" if cfg.subset else ""
        raise DataError(
            f"data.source {cfg.source}: not readable from the local datasets cache "
            f"({ds_config.HF_DATASETS_CACHE}): {type(e).__name__}: {str(e)[:300]}. Download it once "
            f'where the hub is reachable, with the same HF_HOME: python -c "import datasets; '
            f'datasets.load_dataset({cfg.source!r}{subset}, split={cfg.split!r})", or export it to a '
            ".parquet / .jsonl file and give its path"
        ) from None
    finally:
        ds_config.HF_HUB_OFFLINE = offline


def _column(ds, cfg: DataConfig, key: str) -> list:
    top = key.split(".", 1)[0]
    if top not in ds.column_names:
        raise DataError(f"data.source {cfg.source}: no field {key!r} (its fields: {ds.column_names})")
    return ds[top]


def _field(value: object, key: str) -> object:
    """`value` (a row's top-level field) followed down the rest of the dotted `key`."""
    for part in key.split(".")[1:]:
        value = value.get(part) if isinstance(value, dict) else None
    return value
