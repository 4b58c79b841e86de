"""How many tokens history's drafts would have had accepted, replayed offline: a zoo
policy samples `--samples` responses to each of `--prompts` different training prompts in
`--passes` independent passes (vLLM, temperature 1; saved to, or read back from,
`--responses`), then each pass after the first is replayed token by token with the
earlier ones as the prompts' history (as kept servers hold earlier epochs') and the
sibling samples growing beside each other (each step drafting from the others' tokens of
the steps before it, as the engine's rows do), drafting with specrl.rollout.history at each
setting of the grid; the first pass is replayed with its siblings and the prompt only.

A deterministic draft token is accepted with the probability that the policy samples it,
so the leading draft tokens that agree with the policy's own next tokens are distributed
as its accepted ones (rollout/hybrid.py): agreement with sampled responses measures
acceptance without an engine, in seconds per setting, free of the timing noise of a
2-core machine. History here is written by the same policy (no RL step in between), an
upper bound on what `bench history` measures after the policy moved.

Why: on RL-Think the hybrid barely beats EAGLE-3 alone; this says whether any history
setting could (docs/benchmarks.md, "History drafting over the epochs of an RL run"), and
what a change to the index gains on the same responses (docs/draft.md).

    .venv/bin/python scripts/history_replay.py --task rl-think [--out replay.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import numpy as np
from rich.console import Console

from specrl.bench.rollout import zoo_prompts
from specrl.bench.tasks import TASKS
from specrl.config import resolve_model_path
from specrl.rollout.history import HistoryIndex
from specrl.rollout.hybrid import agreed

Responses = dict[str, dict]  # prompt -> {"prompt": token ids, "passes": [[response ids]]}


def sample(task: str, prompts: int, samples: int, passes: int, console: Console) -> Responses:
    from vllm import LLM, SamplingParams

    t = TASKS[task]
    texts = zoo_prompts(prompts, console, distinct=True)
    model = resolve_model_path(f"zoo:{t.zoo}target")
    llm = LLM(model=model, dtype="float32", max_model_len=512, seed=0, enforce_eager=True)  # as servers run
    tokenizer = llm.get_tokenizer()
    ids = [{"prompt_token_ids": tokenizer(p, add_special_tokens=False)["input_ids"]} for p in texts]
    out: Responses = {p: {"prompt": i["prompt_token_ids"], "passes": []} for p, i in zip(texts, ids)}
    for n in range(passes):  # vLLM seeds a request's n samples seed, seed + 1, ...: far apart
        params = SamplingParams(temperature=1.0, max_tokens=t.max_tokens, n=samples, seed=1000 * n + 7)
        for p, r in zip(texts, llm.generate(ids, params, use_tqdm=False)):
            out[p]["passes"].append([list(o.token_ids) for o in r.outputs])
    return out


def replay(data: Responses, draft: int, replayed: int, **settings: float) -> dict[str, float]:
    """Tokens per step over every step, and as vLLM counts acceptance (1 + accepted per
    step that drafted), for pass `replayed` with the earlier ones as history."""
    index = HistoryIndex(**settings)
    steps = drafted = accepted = emitted = 0
    for key, d in data.items():
        k, prompt = key.encode(), d["prompt"]
        for response in itertools.chain(*d["passes"][:replayed]):
            seq = index.start(k, prompt)
            index.extend(k, seq, response)
            index.finish(k, seq)
        siblings = d["passes"][replayed]
        seqs = [index.start(k, prompt) for _ in siblings]
        at = [0] * len(siblings)
        live = [i for i, r in enumerate(siblings) if r]
        while live:  # the siblings grow a step at a time, together
            grown = []
            for i in live:  # each drafts from the others' tokens of the steps before, as in the engine
                r = siblings[i]
                context = np.array(prompt + r[: at[i]], dtype=np.int32)
                found = index.propose(k, seqs[i], context, at[i], draft)
                n = agreed(found, r[at[i] :])
                step = min(n + 1, len(r) - at[i])
                steps, drafted, accepted = steps + 1, drafted + bool(found), accepted + n
                emitted += step
                grown.append((i, r[at[i] : at[i] + step]))
                at[i] += step
            for i, tokens in grown:  # the step's tokens into the trees, a finished response ended
                index.extend(k, seqs[i], tokens)
                if at[i] >= len(siblings[i]):
                    index.finish(k, seqs[i])
            live = [i for i in live if at[i] < len(siblings[i])]
    return {
        "tokens_per_step": round(emitted / steps, 3),
        "acceptance_length": round(1 + accepted / drafted, 3) if drafted else 1.0,
        "drafted_share": round(drafted / steps, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="rl-think", choices=sorted(TASKS))
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--samples", type=int, default=4, help="per prompt and pass (a group)")
    parser.add_argument("--passes", type=int, default=2, help="epochs of the same policy")
    parser.add_argument(
        "--responses", help="JSON file of the sampled responses: read if it exists, else written"
    )
    parser.add_argument("--draft", default="3,8,12", help="history's longest drafts")
    parser.add_argument("--max-spec-factor", default="1,2,4")
    parser.add_argument("--min-token-prob", default="0.1,0.3")
    parser.add_argument("--max-depth", default="16", help="tokens a match and its draft span")
    parser.add_argument("--out", help="JSON file for the rows")
    opts = parser.parse_args()
    console = Console(stderr=True)
    if opts.responses and os.path.exists(opts.responses):
        with open(opts.responses) as f:
            data = json.load(f)
    else:
        data = sample(opts.task, opts.prompts, opts.samples, opts.passes, console)
        if opts.responses:
            with open(opts.responses, "w") as f:
                json.dump(data, f)
    passes = len(next(iter(data.values()))["passes"])
    rows = []
    settings = (opts.draft, opts.max_spec_factor, opts.min_token_prob, opts.max_depth)
    grid = itertools.product(*(map(float, v.split(",")) for v in settings))
    for (draft, factor, prob, depth), replayed in itertools.product(grid, range(passes)):
        tree = {"max_spec_factor": factor, "min_token_prob": prob, "max_depth": int(depth)}
        row = {"task": opts.task, "pass": replayed, "draft": int(draft)} | tree
        row |= replay(data, int(draft), replayed, **tree)
        rows.append(row)
        console.print(rows[-1])
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump({"prompts": opts.prompts, "samples": opts.samples, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
