"""The draft-trainer service (`specrl serve draft-trainer`): online adaptation inside the
RL loop, gradient isolation from the policy, and what it does with bad input.

- In the loop: the generic-init EAGLE-3 draft adapted online ends with a clearly higher
  measured acceptance length than the same draft frozen, same prompts, same seed
  (`adapted_run` is shared with the system-level lossless test).
- Isolation: a trainer whose features a running draft-trainer consumes ends with weights
  bit-identical to a trainer without capture or draft-trainer, on the same batches.
- Bad input: a draft that does not fit the target is refused before the service serves;
  a bad batch is refused and counted, and what is published and saved is the last good
  draft, which a restarted draft-trainer resumes from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from specrl.config import CaptureConfig, DraftTrainerServerConfig, TrainerServerConfig
from specrl.draft.api import DraftTrainerClient
from specrl.draft.eagle3 import Eagle3Head
from specrl.draft.service import DraftConfigError, DraftTrainerCore, load_head
from specrl.launcher import ServiceProcess, start_all
from specrl.trainer.api import Rollout, TrainerClient
from specrl.trainer.capture import Capturer

from helpers import system_run

pytestmark = [pytest.mark.zoo, pytest.mark.timed]  # the draft-trainer keeps pace with the loop


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_online_adaptation_in_the_rl_loop_beats_the_same_draft_frozen(adapted_run, servers, tmp_path):
    servers.close()
    frozen = system_run(tmp_path, "frozen").records
    adapted = adapted_run.records
    assert [r["group_ids"] for r in frozen] == [r["group_ids"] for r in adapted]
    al_frozen = [round(r["acceptance_length"], 3) for r in frozen]
    al_adapted = [round(r["acceptance_length"], 3) for r in adapted]
    estimates = [round(r["draft"]["acceptance_estimate"], 3) for r in adapted]
    print(f"acceptance per step: frozen {al_frozen}, adapted {al_adapted}; held-out estimate {estimates}")
    # step 0 runs the same initial draft on the same policy and prompts
    assert abs(al_frozen[0] - al_adapted[0]) < 0.15
    assert all(r["draft"] is None for r in frozen)
    # every later step runs a draft trained against the policy one version older
    for r in adapted[1:]:
        d = r["draft"]
        assert (d["version"] >= 1 and d["policy_version"] == r["step"] - 1) or d["held_back"], d
    later = slice(1, None)
    gain = sum(al_adapted[later]) / len(al_adapted[later]) - sum(al_frozen[later]) / len(al_frozen[later])
    assert gain > 0.4, (al_frozen, al_adapted)


@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_a_draft_over_a_smaller_vocabulary_is_adapted_and_published_into_the_engine(servers, tmp_path):
    """A fresh head over 32 of the zoo's 128 tokens (EAGLE-3's d2t / t2d), barely trained
    by `specrl draft init`, adapted online in the RL loop: every update reaches the
    engine, vocabulary map included (the engine's checkpoint has `d2t`; updates without
    it were refused, so such a draft was never adapted), and the acceptance the engine
    measures rises."""
    servers.close()  # two cores: no other engine while it runs
    draft = tmp_path / "draft"
    cmd = [sys.executable, "-m", "specrl.cli", "draft", "init", "--target", "zoo:target", "--out", str(draft)]
    cmd += ["--prompts", "160", "--steps", "4", "--set", "draft_vocab_size=32"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    records = system_run(tmp_path, "small-vocabulary", adapt=True, draft=str(draft)).records
    accepted = [round(r["acceptance_length"], 3) for r in records]
    for r in records[1:]:
        assert r["draft"]["updated"] and not r["draft"]["held_back"], r["draft"]
    assert accepted[-1] > accepted[0] + 0.3, accepted


def _zoo_rollouts(n: int) -> list[Rollout]:
    """The zoo's own target rollouts as a training batch (rewards alternate)."""
    from transformers import AutoTokenizer

    from specrl.config import resolve_model_path
    from specrl.data import task
    from specrl.zoo.build import ZooSpec, task_kwargs

    root = Path(resolve_model_path("zoo:"))
    tok = AutoTokenizer.from_pretrained(str(root / "target"))
    spec = ZooSpec()
    completions = json.loads((root / "rollouts.json").read_text())[:n]
    prompts = [p.prompt for p in task.take(spec.rollouts, seed=2, **task_kwargs(spec))][:n]
    return [
        Rollout(tok(p, add_special_tokens=False)["input_ids"], c, float(i % 2))
        for i, (p, c) in enumerate(zip(prompts, completions))
    ]


def _trainer(capture: bool, name: str, tmp_path: Path) -> ServiceProcess:
    cfg = TrainerServerConfig.model_validate(
        {
            "port": 0,
            "trainer": {
                "model": "zoo:target",
                "micro_batch_size": 8,
                "optim": {"lr": 1e-4},
                "capture": {"enabled": capture},
            },
        }
    )
    return ServiceProcess(cfg, service="trainer", log_path=tmp_path / f"{name}.log")


@pytest.mark.timeout(600)
def test_policy_weights_are_identical_with_and_without_the_draft_trainer(zoo, servers, tmp_path):
    from safetensors.torch import load_file

    servers.close()
    plain, captured = _trainer(False, "plain", tmp_path), _trainer(True, "captured", tmp_path)
    start_all([plain, captured])
    draft_cfg = DraftTrainerServerConfig(
        port=0, trainer=captured.address, draft="zoo:eagle3-generic", training={"holdout_every": 4}
    )
    draft = ServiceProcess(draft_cfg, service="draft-trainer", log_path=tmp_path / "draft.log").start()
    batches = [_zoo_rollouts(64)[i : i + 32] for i in (0, 32)]
    try:
        saved = {}
        for name, p in (("plain", plain), ("captured", captured)):
            with TrainerClient(p.address) as t:
                for batch in batches:
                    t.train_step(batch, group_size=4)
                saved[name] = t.save(str(tmp_path / name)).hf_path
        with DraftTrainerClient(draft.address) as d:
            status = d.status()
        assert status.steps >= 4 and status.refused == 0, status  # it trained while the policy did
        a = load_file(str(Path(saved["plain"]) / "model.safetensors"))
        b = load_file(str(Path(saved["captured"]) / "model.safetensors"))
        assert a.keys() == b.keys()
        changed = [n for n in a if not torch.equal(a[n], b[n])]
        assert not changed, f"the draft-trainer changed the policy's weights: {changed[:5]}"
    finally:
        for p in (draft, plain, captured):
            p.stop()


def test_a_draft_that_does_not_fit_the_target_is_refused_before_serving(zoo, tmp_path):
    with pytest.raises(DraftConfigError, match="target zoo:draft has 2 layers"):
        load_head("zoo:eagle3-generic", "zoo:draft")  # the small external draft model as target
    cfg = DraftTrainerServerConfig(trainer="127.0.0.1:9", draft="zoo:draft", target="zoo:target")
    path = tmp_path / "draft-trainer.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    out = subprocess.run(
        [sys.executable, "-m", "specrl.cli", "serve", "draft-trainer", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert "not a usable EAGLE-3 config" in " ".join(out.stderr.split())  # rich wraps lines


def _captured_batches(n: int) -> list:
    """Features the trainer's Capturer takes from the zoo target over its rollouts."""
    from transformers import Qwen3ForCausalLM

    from specrl.config import resolve_model_path
    from specrl.draft.offline import pad

    target = Qwen3ForCausalLM.from_pretrained(resolve_model_path("zoo:target"), dtype=torch.float32).eval()
    capturer = Capturer(CaptureConfig(enabled=True), target.config.num_hidden_layers, seed=0)
    rollouts = _zoo_rollouts(8 * n)
    out = []
    for b in range(n):
        rs = rollouts[8 * b : 8 * (b + 1)]
        masks = [[0] * (len(r.prompt_ids) - 1) + [1] * len(r.completion_ids) for r in rs]
        ids, attn, mask = pad([r.prompt_ids + r.completion_ids for r in rs], masks, 0)
        with torch.no_grad():
            o = target(input_ids=ids, attention_mask=attn, output_hidden_states=True)
        out.append(
            capturer.capture(
                o.hidden_states, torch.log_softmax(o.logits[:, :-1], -1), ids, attn, mask[:, :-1], b
            )
        )
    return out


def test_bad_batches_are_refused_and_only_the_last_good_draft_is_published_and_saved(zoo, tmp_path):
    cfg = DraftTrainerServerConfig(
        trainer="127.0.0.1:9",  # not contacted: the stream is not started, the target is given
        draft="zoo:eagle3-generic",
        target="zoo:target",
        training={"lr": 1e-3, "holdout_every": 2},
        save_dir=str(tmp_path / "draft"),
    )
    core = DraftTrainerCore(cfg)
    good = _captured_batches(4)
    bad = _captured_batches(1)[0]
    bad.aux[0, 0, 0] = float("nan")
    try:
        for b in good[:2]:
            core._train(b)
        weights = {n: t.clone() for n, t in core.online.head.state_dict().items()}
        core._train(bad)
        assert core.status()["refused"] == 1 and "NaN" in core.status()["last_error"]
        assert all(torch.equal(weights[n], t) for n, t in core.online.head.state_dict().items())
        for b in good[2:]:
            core._train(b)
        out = core.push([])  # no replicas: published and saved all the same
        assert out.version == 1 and not out.held_back, out
        assert all(torch.isfinite(t).all() for t in core.published.state.values())
    finally:
        core.stop()
    embed = core.online.head.embed.weight
    saved = Eagle3Head.load(tmp_path / "draft", embed).state_dict()
    assert all(torch.equal(saved[n], t) for n, t in core.published.state.items())
    assert json.loads((tmp_path / "draft" / "specrl_draft.json").read_text())["version"] == 1

    again = DraftTrainerCore(cfg)  # a restarted draft-trainer resumes from what it published
    try:
        assert again.published.version == 1 and again.status()["published_version"] == 1
        assert all(torch.equal(again.published.state[n], t) for n, t in core.published.state.items())
    finally:
        again.stop()
