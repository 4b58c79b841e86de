"""The tiny model zoo: loadable by transformers, peaked but not trivial, drafts ordered
by how in-domain their training data was, and cached."""

import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

from specrl.zoo.build import ZooSpec, build_zoo

pytestmark = pytest.mark.zoo

# a zoo of the same stages in seconds, for the tests of the build itself
MINI = ZooSpec(
    corpus_size=200,
    num_layers=7,
    target_steps=3,
    target_batch=8,
    rollouts=16,
    rollout_max_tokens=8,
    eagle_steps=2,
    eagle_batch=8,
    generic_texts=16,
    draft_steps=2,
)


def test_manifest_and_cache_reuse(zoo):
    root = Path(zoo["root"])
    t0 = time.perf_counter()
    again = build_zoo()
    assert time.perf_counter() - t0 < 5, "a matching cached build must be reused"
    assert again["key"] == zoo["key"]
    for name in ("target", "eagle3-domain", "eagle3-generic", "draft"):
        assert (root / name / "config.json").exists(), name


def test_target_is_peaked_but_not_trivial(zoo):
    t = zoo["models"]["target"]
    assert 0.03 <= t["test_accuracy_greedy"] <= 0.95
    assert 0.01 <= t["test_accuracy_sampled"] <= 0.95


def test_domain_draft_beats_generic_draft(zoo):
    dom = zoo["models"]["eagle3-domain"]["heldout_top1_agreement"]
    gen = zoo["models"]["eagle3-generic"]["heldout_top1_agreement"]
    assert dom[0] > 0.6, dom
    assert dom[0] > gen[0] + 0.05 and sum(dom) > sum(gen), (dom, gen)


def test_eagle3_config_is_what_vllm_loads(zoo):
    cfg = json.loads((Path(zoo["root"]) / "eagle3-domain" / "config.json").read_text())
    target = json.loads((Path(zoo["root"]) / "target" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    ids = cfg["eagle_aux_hidden_state_layer_ids"]
    assert len(set(ids)) == 3 and max(ids) < target["num_hidden_layers"]
    assert cfg["hidden_size"] == target["hidden_size"] and cfg["vocab_size"] == target["vocab_size"]


def test_models_load_in_transformers_with_the_shared_tokenizer(zoo):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("target", "draft"):
        path = f"{zoo['root']}/{name}"
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        ids = tok("Q: 1+2=?\nA:", return_tensors="pt", add_special_tokens=False)["input_ids"]
        assert tok.decode(ids[0]) == "Q: 1+2=?\nA:"
        with torch.no_grad():
            assert model(input_ids=ids).logits.shape[-1] == len(tok) == 128


def test_build_is_the_same_whatever_the_callers_threads_and_differs_by_seed(tmp_path):
    """Two builds of a miniature spec with the same seed, one from a process with one
    compute thread and one from a process with two (a float reduction split over one
    thread or two rounds differently: before builds ran in a fixed environment, three of
    the four miniature models differed so), are byte-identical and carry the same
    fingerprint, which `specrl zoo info` shows and checks; another seed differs."""
    import os
    import subprocess
    import sys

    from typer.testing import CliRunner

    from specrl.cli import app

    def build(root: Path, seed: int, threads: int) -> dict:
        code = (
            "import json, sys; from pathlib import Path; from specrl.zoo.build import ZooSpec, build_zoo; "
            "build_zoo(Path(sys.argv[1]), seed=int(sys.argv[2]), spec=ZooSpec(**json.loads(sys.argv[3])))"
        )
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        args = [sys.executable, "-c", code, str(root), str(seed), json.dumps(dataclasses.asdict(MINI))]
        subprocess.run(args, env=env, check=True, capture_output=True)
        return json.loads((root / "manifest.json").read_text())

    a, b, c = build(tmp_path / "a", 3, 1), build(tmp_path / "b", 3, 2), build(tmp_path / "c", 4, 1)
    assert set(a["fingerprint"]) == {"target", "eagle3-domain", "eagle3-generic", "draft", "all"}
    assert a["fingerprint"] == b["fingerprint"]
    for name in ("target", "eagle3-domain", "eagle3-generic", "draft"):
        model = f"{name}/model.safetensors"
        assert (tmp_path / "a" / model).read_bytes() == (tmp_path / "b" / model).read_bytes(), name
    assert all(c["fingerprint"][n] != a["fingerprint"][n] for n in ("target", "all"))

    shown = CliRunner().invoke(app, ["zoo", "info", "--home", str(tmp_path / "a")])
    assert shown.exit_code == 0 and json.loads(shown.output)["fingerprint"] == a["fingerprint"]
    (tmp_path / "a" / "draft" / "config.json").write_text("{}")  # a file changed after the build
    shown = CliRunner().invoke(app, ["zoo", "info", "--home", str(tmp_path / "a")])
    assert shown.exit_code == 1 and "differ from the build's fingerprint" in shown.output


def test_think_variant_builds_on_the_zoo_is_cached_and_follows_it(tmp_path):
    """The optional RL-Think variant (a miniature here): its target and both heads in
    `<zoo>/think`, loadable like the zoo's; reused while the zoo under it is the same,
    rebuilt when that changes."""
    from typer.testing import CliRunner

    from specrl.cli import app
    from specrl.zoo.think import ThinkSpec, build_think

    think = ThinkSpec(corpus_size=64, sft_steps=2, sft_batch=8, rollouts=16, rollout_max_tokens=24)
    root = tmp_path / "zoo"
    manifest = build_think(root, spec=MINI, think=think)
    assert set(manifest["models"]) == {"target", "eagle3-domain", "eagle3-generic"}
    for name in manifest["models"]:
        assert (root / "think" / name / "config.json").exists(), name
    heads = json.loads((root / "think" / "eagle3-domain" / "config.json").read_text())
    assert heads["architectures"] == ["LlamaForCausalLMEagle3"]
    tuned = root / "think" / "target" / "model.safetensors"
    assert tuned.read_bytes() != (root / "target" / "model.safetensors").read_bytes()
    assert build_think(root, spec=MINI, think=think)["key"] == manifest["key"]
    shown = CliRunner().invoke(app, ["zoo", "info", "--home", str(root)])
    assert shown.exit_code == 0 and json.loads(shown.output)["think"]["key"] == manifest["key"]
    other = build_think(root, spec=dataclasses.replace(MINI, draft_steps=1), think=think)
    assert other["key"] != manifest["key"]  # the zoo under it changed: built again
    assert not list(root.parent.glob(".*.building")) and not list(root.glob(".*.building"))
