"""Your own data: GSM8K, MATH, DAPO-Math and chat-message rows read as their datasets
publish them, through the real zoo tokenizer (a real HF fast tokenizer with a chat
template of the ChatML kind), with each reference's final answer extracted by the
dataset's convention and scoring full reward against itself; bad rows skipped and
counted by reason; `specrl data check` failing on answers it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrl.config import DataConfig
from specrl.data.check import check_data
from specrl.data.rewards import math_reward, reference_answer
from specrl.data.sources import DataError, PromptSource, end_of_turn_ids


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from specrl.zoo import tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.build(path)
    return AutoTokenizer.from_pretrained(str(path))


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


GSM8K = [
    {"question": "Tom has 38 apples and gets 34 more. He eats 4. How many are left?",
     "answer": "He has 38+34=<<38+34=72>>72. Then 72-4=<<72-4=68>>68.\n#### 68"},
    {"question": "A box holds 1,200 pens; 200 are sold. How many remain?",
     "answer": "1200-200=1000\n#### 1,000"},
]  # fmt: skip
MATH = [
    {"problem": "What is $\\frac{1}{4}+\\frac{1}{4}$?",
     "solution": "Adding, $\\frac{1}{4}+\\frac{1}{4}=\\boxed{\\frac{1}{2}}$."},
    {"problem": "Expand $(x+1)^2-2x$.", "solution": "We get $x^2+2x+1-2x=\\boxed{x^2+1}$."},
]  # fmt: skip
DAPO = [
    {"prompt": [{"role": "user", "content": "Solve 3*x = 102. Put the answer in \\boxed{}."}],
     "reward_model": {"ground_truth": "34", "style": "rule"}, "data_source": "math_dapo"},
    {"prompt": [{"role": "system", "content": "Reason step by step."},
                {"role": "user", "content": "What is 7*8?"}],
     "reward_model": {"ground_truth": "56", "style": "rule"}, "data_source": "math_dapo"},
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "fmt", "answer"),
    [
        ("x\n#### 68", "auto", "68"),
        ("1200-200=1000\n#### 1,000", "gsm8k", "1,000"),
        ("so $\\boxed{\\frac{1}{2}}$.", "auto", "\\frac{1}{2}"),
        ("\\boxed{x^{2}+1}", "boxed", "x^{2}+1"),
        (" 34 ", "auto", "34"),
        ("-3/4", "plain", "-3/4"),
        ("no hashes here", "gsm8k", None),
        ("no box", "boxed", None),
        ("", "plain", None),
    ],
)
def test_reference_answers_follow_the_datasets_convention(text, fmt, answer):
    assert reference_answer(text, fmt) == answer


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("<think>7*8 is 54? no, 56</think> The answer is \\boxed{56}.", 1.0),
        ("<think>maybe \\boxed{56}</think> The answer is 54.", 0.0),  # the answer after the reasoning counts
        ("<think>7*8 = 56, so \\boxed{56} ...", 0.0),  # cut off while thinking: no answer stated
        ("The answer is 56.", 1.0),  # no reasoning block: the whole completion
    ],
)
def test_the_reward_reads_the_answer_after_the_reasoning(completion, reward):
    assert math_reward(completion, "56") == reward


def test_gsm8k_rows_give_the_templated_prompt_and_the_final_answer(tok, tmp_path):
    cfg = DataConfig(
        source=jsonl(tmp_path / "gsm8k.jsonl", GSM8K), prompt_key="question", shuffle=False,
        template="Q: {prompt}\nA:",
    )  # fmt: skip
    source = PromptSource(cfg, tok, max_prompt_tokens=200)
    items = source.batch(2)
    assert [i.answer for i in items] == ["68", "1,000"]
    assert items[0].prompt == f"Q: {GSM8K[0]['question']}\nA:"
    assert items[0].prompt_ids == tok(items[0].prompt, add_special_tokens=False)["input_ids"]
    assert not source.uses_chat and source.stop_token_ids() == [tok.eos_token_id]
    # the case: a completion that copies the reference solution scores 1.0
    assert math_reward(GSM8K[0]["answer"], items[0].answer) == 1.0
    assert math_reward("#### 68", items[0].answer) == 1.0
    report = check_data(cfg, tok, math_reward, max_prompt_tokens=200, rows=10)
    assert (report.read, report.kept, report.full_reward, report.problem) == (2, 2, 2, None)


def test_math_solutions_give_their_boxed_answer(tok, tmp_path):
    cfg = DataConfig(
        source=jsonl(tmp_path / "math.jsonl", MATH),
        prompt_key="problem",
        answer_key="solution",
        shuffle=False,
    )
    items = PromptSource(cfg, tok, max_prompt_tokens=200).batch(2)
    assert [i.answer for i in items] == ["\\frac{1}{2}", "x^2+1"]
    assert math_reward("so it is \\boxed{0.5}", items[0].answer) == 1.0
    report = check_data(cfg, tok, math_reward, max_prompt_tokens=200, rows=10)
    assert report.full_reward == report.kept == 2 and report.problem is None


def test_dapo_chat_rows_go_through_the_chat_template_and_stop_at_its_end_of_turn(tok, tmp_path):
    import pandas as pd

    path = tmp_path / "dapo.parquet"
    pd.DataFrame(DAPO).to_parquet(path)  # nested: a list of messages, a struct of answers
    cfg = DataConfig(source=str(path), answer_key="reward_model.ground_truth", shuffle=False)
    source = PromptSource(cfg, tok, max_prompt_tokens=200)
    items = source.batch(2)
    assert [i.answer for i in items] == ["34", "56"]
    for item, row in zip(items, DAPO):
        rendered = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        assert item.prompt == rendered and rendered.endswith("<|im_start|>assistant\n")
        assert item.prompt_ids == tok(rendered, add_special_tokens=False)["input_ids"]
    assert items[1].prompt.startswith("<|im_start|>system\nReason step by step.<|im_end|>")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert source.uses_chat and end_of_turn_ids(tok) == [im_end]
    assert source.stop_token_ids() == sorted([tok.eos_token_id, im_end])
    report = check_data(cfg, tok, math_reward, max_prompt_tokens=200, rows=10)
    assert report.full_reward == report.kept == 2 and report.chat and report.problem is None


def test_text_rows_wrapped_as_a_user_message_with_a_system_prompt_and_template_kwargs(tok, tmp_path):
    cfg = DataConfig.model_validate(
        {
            "source": jsonl(tmp_path / "g.jsonl", GSM8K[:1]),
            "prompt_key": "question",
            "template": "{prompt} Put the answer in \\boxed{}.",
            "chat": {"enabled": True, "system": "Be brief.", "template_kwargs": {"enable_thinking": False}},
        }
    )
    item = PromptSource(cfg, tok, max_prompt_tokens=300).next()
    user = f"{GSM8K[0]['question']} Put the answer in \\boxed{{}}."
    assert item.prompt == (
        f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_bad_rows_are_skipped_and_counted_by_reason(tok, tmp_path):
    from transformers import AutoTokenizer

    rows = [
        {"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"},  # no #### (answer_format: gsm8k)
        {"prompt": ["not", "messages"], "answer": "#### 1"},
        {"prompt": [{"role": "wizard", "content": "hi"}], "answer": "#### 1"},
        {"prompt": [{"role": "user", "content": "   "}], "answer": "#### 1"},
        {"prompt": [{"role": "user", "content": "REFUSE"}], "answer": "#### 1"},  # the template raises
        {"prompt": [{"role": "user", "content": "no answer"}], "answer": None},
        {"prompt": 12, "answer": "#### 1"},
        {"prompt": [{"role": "user", "content": "x" * 400}], "answer": "#### 1"},
        {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "about 4"},  # no ####
    ]
    strict = AutoTokenizer.from_pretrained(tok.name_or_path)
    strict.chat_template = (
        "{% for m in messages %}{% if m['content'] == 'REFUSE' %}{{ raise_exception('no') }}{% endif %}"
        + tok.chat_template.split("{% for m in messages %}", 1)[1]
    )
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(source=str(path), shuffle=False, answer_format="gsm8k")
    report = check_data(cfg, strict, math_reward, max_prompt_tokens=100, rows=100)
    assert report.read == 9 and report.kept == 0
    assert report.skipped == {
        "answer not found": 2,
        "malformed messages": 1,
        "unknown role": 1,
        "empty prompt": 1,
        "template failed": 1,
        "missing field": 1,
        "malformed prompt": 1,
        "prompt too long": 1,
    }
    assert "none of the 9 rows checked is usable" in report.problem


def test_a_missing_field_names_it_and_the_fields_the_data_has(tok, tmp_path):
    cfg = DataConfig(source=jsonl(tmp_path / "g.jsonl", GSM8K), prompt_key="question", answer_key="solution")
    with pytest.raises(DataError, match=r"no field 'solution' \(its fields: \['question', 'answer'\]\)"):
        PromptSource(cfg, tok, max_prompt_tokens=100)
    no_template = type(tok).from_pretrained(tok.name_or_path)
    no_template.chat_template = None
    with pytest.raises(DataError, match="no chat template"):
        PromptSource(DataConfig(chat={"enabled": True}), no_template, max_prompt_tokens=100)


def test_answers_read_the_wrong_way_fail_the_check(tok, tmp_path):
    """GSM8K answers taken whole (the old behaviour, `answer_format: plain`): the reference
    solution itself scores 0 against them, so the check fails and says why."""
    cfg = DataConfig(
        source=jsonl(tmp_path / "gsm8k.jsonl", GSM8K), prompt_key="question", answer_format="plain"
    )
    report = check_data(cfg, tok, math_reward, max_prompt_tokens=200, rows=10)
    assert report.kept == 2 and report.full_reward == 0
    assert "only 0 of 2 references score full reward" in report.problem


def _run_yaml(tmp_path: Path, model: str, data: dict) -> Path:
    cfg = {
        "data": data,
        "rollout": {"server": {"engine": {"model": model}}},
        "trainer": {"server": {"trainer": {"model": model}}},
    }
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(cfg))
    return path


def _data_check(config: Path, *args: str, env: dict | None = None):
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "specrl.cli", "data", "check", "--config", str(config), *args]
    env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def test_data_check_command_passes_on_gsm8k_and_fails_when_the_answers_are_read_whole(tok, tmp_path):
    data = {"source": jsonl(tmp_path / "gsm8k.jsonl", GSM8K), "prompt_key": "question"}
    good = _data_check(_run_yaml(tmp_path, tok.name_or_path, data))
    assert good.returncode == 0, good.stderr
    out = " ".join(good.stderr.split())
    assert "2 of 2 rows usable" in out and "2 of 2 references score full reward" in out
    assert "has a chat template and the prompts do not go through it" in out  # the note for chat models
    bad = _data_check(_run_yaml(tmp_path, tok.name_or_path, data), "--set", "data.answer_format=plain")
    assert bad.returncode == 1
    assert "only 0 of 2 references score full reward" in " ".join(bad.stderr.split())


def test_a_hub_dataset_is_read_from_the_local_cache_or_refused_saying_how_to_get_it(tok, tmp_path):
    """`data.source: openai/gsm8k` with its subset: read from the datasets cache (laid out
    here as `datasets` leaves it after downloading, from a local file: no hub here); a
    dataset not in the cache is refused with the command that fetches it."""
    from datasets.packaged_modules.json.json import Json

    cache = tmp_path / "hf" / "datasets"
    prepared = Json(
        dataset_name="gsm8k",
        config_name="main",
        data_files={"train": jsonl(tmp_path / "gsm8k.jsonl", GSM8K)},
        cache_dir=str(cache),
        hash="0",
    )
    prepared.download_and_prepare()
    config_dir = next((cache / "gsm8k").iterdir())  # main-<hash of the data files>
    (cache / "openai___gsm8k").mkdir()
    config_dir.rename(cache / "openai___gsm8k" / "main")  # what a download of openai/gsm8k leaves
    env = {"HF_HOME": str(tmp_path / "hf")}
    data = {"source": "openai/gsm8k", "subset": "main", "prompt_key": "question"}
    cached = _data_check(_run_yaml(tmp_path, tok.name_or_path, data), env=env)
    assert cached.returncode == 0, cached.stderr
    assert "2 of 2 references score full reward" in " ".join(cached.stderr.split())
    missing = _data_check(_run_yaml(tmp_path, tok.name_or_path, data | {"source": "nobody/nothing"}), env=env)
    said = " ".join(missing.stderr.split())
    assert missing.returncode == 2 and "not readable from the local datasets cache" in said
    assert "datasets.load_dataset('nobody/nothing', 'main', split='train')" in said


def test_a_step_without_learning_signal_says_so_and_counts_the_streak():
    """Every group with equal rewards: the step line says so and the metrics count the
    steps in a row (the alert's input); a step with signal resets the streak."""
    from prometheus_client import CollectorRegistry

    from specrl.metrics import OrchestratorMetrics
    from specrl.orchestrator.loop import Orchestrator
    from specrl.orchestrator.run import step_line

    time = dict.fromkeys(("step", "gen", "exposed_generation", "logprob", "train", "prepare"), 0.1)
    record = {"step": 0, "reward_mean": 0.0, "acceptance_length": 1.0, "lag": {"max": 0}, "time": time}
    assert "no learning signal" in step_line(record | {"zero_variance_groups": 1.0}, 10)
    assert "no learning signal" not in step_line(record | {"zero_variance_groups": 0.5}, 10)

    registry = CollectorRegistry()
    loop = Orchestrator.__new__(Orchestrator)  # only its metrics bookkeeping is exercised
    loop.metrics, loop._no_signal_streak = OrchestratorMetrics(registry), 0
    streak = []
    for share in (1.0, 1.0, 1.0, 0.25, 1.0):
        loop._observe_signal(share)
        streak.append(registry.get_sample_value("specrl_steps_without_signal"))
    assert streak == [1, 2, 3, 0, 1]
    assert registry.get_sample_value("specrl_step_zero_variance_groups_ratio") == 1.0


def test_a_step_leaves_its_values_in_gauges_until_the_next():
    """Dashboards read the last step's stage times, exposed generation share and idle
    shares from gauges (a rate of a histogram observed once a step is 0/0 between steps
    minutes apart); a step's record sets them, next to the histograms it observes."""
    from prometheus_client import CollectorRegistry

    from specrl.metrics import STAGES, OrchestratorMetrics
    from specrl.orchestrator.loop import Orchestrator

    registry = CollectorRegistry()
    loop = Orchestrator.__new__(Orchestrator)  # only its metrics bookkeeping is exercised
    loop.metrics, loop._no_signal_streak = OrchestratorMetrics(registry), 0
    time = dict.fromkeys(STAGES, 10.0) | {"exposed_generation": 75.0, "step": 300.0}
    record = {
        "step": 4, "time": time, "lag_counts": {"0": 3, "1": 1}, "samples": 4, "stale_samples": 0,
        "stale_kept_samples": 0, "duplicate_samples": 0, "queue_depth": {"prompts": 2},
        "replicas": ["r0:9400"], "reward_mean": 0.5, "zero_variance_groups": 0.25,
        "acceptance_length": 2.5, "idle": {"trainer": 240.0, "rollout": -1.0},
        "replica_idle": {"r0:9400": 30.0},
    }  # fmt: skip
    loop._observe(record)
    value = registry.get_sample_value
    assert value("specrl_last_step_seconds") == 300.0
    assert value("specrl_last_step_stage_seconds", {"stage": "exposed_generation"}) == 75.0
    assert {value("specrl_last_step_stage_seconds", {"stage": s}) for s in STAGES} == {10.0, 75.0}
    assert value("specrl_last_step_exposed_generation_share") == 0.25
    assert value("specrl_last_step_idle_share", {"role": "trainer"}) == 0.8
    assert value("specrl_last_step_idle_share", {"role": "rollout"}) == 0.0
    # the histograms are still observed
    assert value("specrl_step_stage_seconds_count", {"stage": "exposed_generation"}) == 1
    assert value("specrl_step_seconds_sum") == 300.0
    assert value("specrl_rollout_replica_idle_seconds_total", {"replica": "r0:9400"}) == 30.0
    loop._observe(record | {"time": time | {"step": 60.0, "exposed_generation": 30.0}})
    assert value("specrl_last_step_seconds") == 60.0  # the last step's, not a mean
    assert value("specrl_last_step_exposed_generation_share") == 0.5
