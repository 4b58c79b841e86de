import pytest

from specrl.config import (
    ConfigError,
    DraftTrainerServerConfig,
    RolloutServerConfig,
    TrainerServerConfig,
    VllmEngineConfig,
    load_config,
    resolve_model_path,
)


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_and_overrides(tmp_path):
    cfg = load_config(write(tmp_path, "port: 1234\n"), RolloutServerConfig, {"speculation.method": "ngram"})
    assert cfg.port == 1234 and cfg.speculation.method == "ngram" and cfg.speculation.k == 3
    assert RolloutServerConfig().speculation.k == 0


@pytest.mark.parametrize(
    "text, field",
    [
        ("speculation: {method: medusa}", "speculation.method"),
        ("speculation: {method: ngram, num_speculative_tokens: 0}", "speculation.num_speculative_tokens"),
        ("speculation: {method: ngram, num_speculative_tokens: 17}", "speculation.num_speculative_tokens"),
        ("speculation: {method: eagle3}", "draft is required"),
        ("speculation: {method: ngram, draft: x}", "no effect"),
        ("engine: {modle: x}", "engine.modle"),
        ("port: -1", "port"),
        ("speculation: {method: ngram, k_schedule: [[2, 4, 3]]}", "must start at batch size 1"),
        ("speculation: {method: ngram, k_schedule: [[1, 4, 3], [6, 8, 1]]}", "without gaps"),
        ("speculation: {method: ngram, num_speculative_tokens: 3, k_schedule: [[1, 4, 5]]}", "k=5 outside"),
        ("speculation: {k_schedule: [[1, 4, 0]]}", "needs a speculation method"),
        ("engine: {max_num_seqs: 64, max_num_batched_tokens: 32}", "at least max_num_seqs"),
        ("engine: {kind: vllm, max_model_len: 8}", "engine.max_model_len"),
        ("engine: {kind: sglang}", "expected tags: 'vllm'"),
    ],
)
def test_bad_configs_name_the_field(tmp_path, text, field):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text), RolloutServerConfig)
    assert field in str(e.value)


def test_an_engine_config_without_a_kind_is_vllms(tmp_path):
    """`engine` is a union tagged by `kind`; configs written before it had a second
    member name no kind and load as they did."""
    cfg = load_config(write(tmp_path, "engine: {model: m, kv_cache_gib: 0.5}"), RolloutServerConfig)
    assert cfg.engine == VllmEngineConfig(model="m", kv_cache_gib=0.5)
    assert RolloutServerConfig().engine.kind == "vllm"


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", RolloutServerConfig)
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"), RolloutServerConfig)


def test_zoo_references_resolve_under_specrl_home(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECRL_HOME", str(tmp_path))
    assert resolve_model_path("zoo:target") == str(tmp_path / "zoo" / "target")
    assert resolve_model_path("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"


@pytest.mark.parametrize(
    ("path", "cls"),
    [
        ("examples/rollout-eagle3.yaml", RolloutServerConfig),
        ("examples/trainer.yaml", TrainerServerConfig),
        ("examples/draft-trainer.yaml", DraftTrainerServerConfig),
    ],
)
def test_shipped_examples_validate(path, cls):
    from pathlib import Path

    load_config(Path(__file__).parents[2] / path, cls)
