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


def test_build_is_reproducible_from_the_seed(tmp_path):
    """Two builds of a miniature spec with the same seed are byte-identical; another seed differs."""
    import hashlib

    def digest(root: Path) -> dict[str, str]:
        return {
            str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.safetensors"))
        }

    a = digest(Path(build_zoo(tmp_path / "a", seed=3, spec=MINI) and tmp_path / "a"))
    b = digest(Path(build_zoo(tmp_path / "b", seed=3, spec=MINI) and tmp_path / "b"))
    c = digest(Path(build_zoo(tmp_path / "c", seed=4, spec=MINI) and tmp_path / "c"))
    assert len(a) == 4 and a == b
    assert a != c


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
