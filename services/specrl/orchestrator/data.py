"""Prompts for the RL loop: the zoo's arithmetic task (generated from a seed) or a file of
{prompt, answer} rows read with HF datasets, so DAPO-Math or GSM8K exports work as they
are. Prompts are tokenized here, once, with the policy's tokenizer: the rollout servers
and the trainer then see the same token ids.

Bad rows never stop a run: a row without the prompt or answer field, with an empty
prompt, or whose prompt leaves no room for the completion in the context is skipped and
counted by reason (`skipped`). A file that cannot be read, or has no usable row, is an
error before anything starts.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specrl.config import DataConfig

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class DataError(ValueError):
    pass


@dataclass(frozen=True)
class Item:
    prompt: str
    answer: str
    prompt_ids: list[int]


class PromptSource:
    """An endless, seeded stream of prompts; `position` items were taken so far (a
    resumed run skips that many)."""

    def __init__(self, cfg: DataConfig, tokenizer, *, max_prompt_tokens: int, position: int = 0) -> None:
        self.cfg = cfg
        self.tok = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.skipped: Counter[str] = Counter()
        self.position = 0
        # a file is read now, so that an unreadable one fails before anything starts
        self._rows = self._task_rows() if cfg.source == "task" else self._cycle(load_rows(cfg))
        for _ in range(position):
            self.next()

    def batch(self, n: int) -> list[Item]:
        return [self.next() for _ in range(n)]

    def next(self) -> Item:
        for _ in range(10_000):
            prompt, answer = next(self._rows)
            item = self._item(prompt, answer)
            if item is not None:
                self.position += 1
                return item
        raise DataError(
            f"data.source {self.cfg.source}: 10000 rows in a row were unusable: {dict(self.skipped)}"
        )

    def _item(self, prompt: object, answer: object) -> Item | None:
        if prompt is None or answer is None:
            self.skipped["missing field"] += 1
            return None
        text = self.cfg.template.replace("{prompt}", str(prompt))  # other braces stay as they are
        if not str(prompt).strip():
            self.skipped["empty prompt"] += 1
            return None
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            self.skipped["prompt too long"] += 1
            return None
        return Item(text, str(answer).strip(), ids)

    def _task_rows(self) -> Iterator[tuple[object, object]]:
        from specrl.zoo import task

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


def load_rows(cfg: DataConfig) -> list[tuple[object, object]]:
    """(prompt, answer) of every row of the file; a row lacking a field gives None there."""
    import datasets

    path = Path(cfg.source)
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"data.source {path}: unknown format (use {', '.join(_FORMATS)})")
    datasets.disable_progress_bars()
    try:
        ds = datasets.load_dataset(fmt, data_files=str(path), split="train")
    except Exception as e:  # datasets raises many types for a malformed file
        raise DataError(f"data.source {path}: cannot read: {type(e).__name__}: {e}") from None
    missing = [k for k in (cfg.prompt_key, cfg.answer_key) if k not in ds.column_names]
    if missing:
        raise DataError(f"data.source {path}: no column {missing} (columns: {ds.column_names})")
    rows = list(zip(ds[cfg.prompt_key], ds[cfg.answer_key]))
    if not rows:
        raise DataError(f"data.source {path}: no rows")
    return rows
