"""`specrl run` configs and data: bad input is a clear error before anything starts, and
bad dataset rows are skipped and counted."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from specrl.config import ConfigError, DataConfig, RunConfig, load_config
from specrl.data.sources import DataError, PromptSource
from specrl.speculation import HISTORY_DRAFT


class CharTokenizer:
    """Stand-in for the policy's tokenizer: one id per character (no model needed)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) % 128 for c in text]}


def _write(tmp_path, text: str, name: str = "run.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("orchestrator: {stepz: 3}", "orchestrator.stepz: Extra inputs are not permitted"),
        ("orchestrator: {max_lag: -1}", "orchestrator.max_lag"),
        ("rollout: {server: {speculation: {method: eagle3, num_speculative_tokens: -1, draft: x}}}",
         "num_speculative_tokens"),
        ("sampling: {n: 1}", "sampling.n"),
        ("data: {source: /no/such/file.jsonl}", "no such file"),
        ("data: {split: test}", "are for a hub dataset id"),
        ("data: {answer_format: latex}", "data.answer_format"),
        ("data: {chat: {enabled: yes, sytem: hi}}", "data.chat.sytem"),
        ("orchestrator: {stale: importance}", "needs trainer.server.trainer.grpo.is_cap"),
        ("rollout: {server: {engine: {model: zoo:draft}}}", "must be the same policy"),
        ("sampling: {max_tokens: 600}", "leaves no room"),
        ("rollout: {replicas: 2, server: {port: 50051}}", "cannot share one port"),
        ("rollout: {replicas: 1, addresses: ['a:1']}", "give one of"),
        ("data: {prompts_per_step: 3}\nsampling: {n: 3}\ntrainer: {server: {trainer: {dp: 2}}}",
         "must split across trainer dp"),
        ("draft_trainer: {enabled: true}\nrollout: {server: {speculation: {method: eagle3, draft: d}}}",
         "capture.enabled: true"),
        ("draft_trainer: {enabled: true}\nrollout: {server: {speculation: {method: ngram}}}",
         "adapts an EAGLE-3 draft"),
        ("draft_trainer: {server: {weight_sync: {kind: policy}}}", "must be 'draft'"),
        ("draft_trainer: {server: {publish_every: 0}}", "publish_every"),
        ("compare: {runs: [ar, ar]}", "lists a run twice"),
        ("compare: {runs: [ar]}\nrollout: {server: {speculation: {method: none}}}", "'ar' is the main run"),
        ("compare: {runs: [async]}\norchestrator: {max_lag: 2}", "needs a synchronous main run"),
        ("compare: {runs: [ar]}\ntrainer: {address: 'h:1'}", "needs the services started here"),
        ("compare: {runs: [sync]}", "compare.runs.0"),
        ("compare: {runs: [ar], steps: 1}", "compare.steps"),
        ("rollout: {server: {port: 5, engine: {nnodes: 2, tensor_parallel_size: 2}}}", "one-machine"),
        ("rollout: {server: {engine: {nnodes: 2, tensor_parallel_size: 3}}}", "split evenly over nnodes"),
        ("orchestrator: {services_timeout_s: 0}", "services_timeout_s"),
        ("launcher: slurm", "launcher"),
        ("ray: {address: auto}", "no effect with launcher local"),
        ("launcher: ray\nray: {trainer_procs_per_node: 3}\ntrainer: {server: {trainer: {tp: 2, dp: 2}}}",
         "must divide the trainer's tp x dp ranks"),
        ("launcher: ray\nray: {cpus_per_process: 0}", "ray.cpus_per_process"),
        ("rollout: {autoscale: {enabled: true}}", "needs rollout.discover"),
        ("rollout: {discover: 'dns:r:1', replicas: 0, autoscale: {enabled: true}}", "set workload"),
        ("launcher: ray\nrollout: {discover: 'dns:r:1', replicas: 0, autoscale: {enabled: true}}",
         "set rollout.replicas"),
    ],
)  # fmt: skip
def test_bad_run_configs_name_the_field(tmp_path, yaml_text, message):
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, yaml_text), RunConfig)


def test_services_started_here_take_free_ports_unless_their_section_names_one():
    """The servers' own default ports are for a server started alone: two replicas (or a
    second run's trainer) on one machine would ask for the same one."""
    model = {"rollout": {"server": {"engine": {"model": "zoo:target"}}}}
    sections = {
        **model,
        "trainer": {"server": {"trainer": {"model": "zoo:target"}}},
        "draft_trainer": {"server": {"publish_every": 2}},
    }
    cfg = RunConfig.model_validate(sections)
    assert (cfg.rollout.server.port, cfg.trainer.server.port, cfg.draft_trainer.server.port) == (0, 0, 0)
    given = {"rollout": {"replicas": 1, "server": {**model["rollout"]["server"], "port": 50051}}}
    assert RunConfig.model_validate(given).rollout.server.port == 50051


def test_the_example_configs_validate():
    from pathlib import Path

    for path in sorted(Path("examples").glob("*rl*.yaml")):
        cfg = load_config(path, RunConfig)
        assert cfg.orchestrator.steps >= 1, path


def test_file_rows_are_read_and_bad_ones_skipped_and_counted(tmp_path):
    rows = [
        {"prompt": "1+1=?", "answer": "2"},
        {"prompt": "", "answer": "0"},  # empty prompt
        {"question": "no prompt field", "answer": "1"},  # missing field
        {"prompt": "x" * 500, "answer": "1"},  # too long for the context
        {"prompt": "2+3=?", "answer": 5},
    ]
    data = _write(tmp_path, "\n".join(json.dumps(r) for r in rows), "data.jsonl")
    cfg = DataConfig(source=str(data), shuffle=False, template="Q: {prompt}\nA:")
    boxed = DataConfig(source=str(data), template="{prompt} Put the answer in \\boxed{}.")
    item = PromptSource(boxed, CharTokenizer(), max_prompt_tokens=100).next()
    assert item.prompt.endswith(" Put the answer in \\boxed{}.")
    source = PromptSource(cfg, CharTokenizer(), max_prompt_tokens=100)
    items = source.batch(4)
    assert [(i.prompt, i.answer) for i in items] == [("Q: 1+1=?\nA:", "2"), ("Q: 2+3=?\nA:", "5")] * 2
    assert items[0].prompt_ids == [ord(c) for c in "Q: 1+1=?\nA:"]
    assert source.skipped == {"empty prompt": 2, "missing field": 2, "prompt too long": 2}
    assert source.position == 4
    resumed = PromptSource(cfg, CharTokenizer(), max_prompt_tokens=100, position=3)
    assert resumed.next().prompt == "Q: 2+3=?\nA:"


def test_unreadable_or_unusable_files_are_errors(tmp_path):
    broken = _write(tmp_path, '{"prompt": "a", "answer": ', "broken.jsonl")
    with pytest.raises(DataError, match="cannot read"):
        PromptSource(DataConfig(source=str(broken)), CharTokenizer(), max_prompt_tokens=100)
    other = _write(tmp_path, '{"q": "a", "a": "1"}\n', "other.jsonl")
    with pytest.raises(DataError, match=r"no field 'prompt' \(its fields: \['q', 'a'\]\)"):
        PromptSource(DataConfig(source=str(other)), CharTokenizer(), max_prompt_tokens=100)
    txt = _write(tmp_path, "hello", "data.txt")
    with pytest.raises(DataError, match="unknown format"):
        PromptSource(DataConfig(source=str(txt)), CharTokenizer(), max_prompt_tokens=100)
    long = _write(tmp_path, json.dumps({"prompt": "x" * 50, "answer": "1"}), "long.jsonl")
    with pytest.raises(DataError, match="unusable"):
        PromptSource(DataConfig(source=str(long)), CharTokenizer(), max_prompt_tokens=10).next()


def test_task_prompts_are_the_zoo_task():
    source = PromptSource(DataConfig(task_max_terms=2), CharTokenizer(), max_prompt_tokens=100)
    item = source.next()
    assert item.prompt.startswith("Q: ") and item.prompt.endswith("=?\nA:")
    assert int(item.answer) == eval(item.prompt[3:-5])


def test_resume_refuses_what_it_cannot_continue_before_anything_starts(tmp_path):
    from rich.console import Console

    from specrl.orchestrator.run import RunExists, _check_resumable, run

    cfg = RunConfig.model_validate({"output_dir": str(tmp_path / "{name}")})
    quiet = Console(quiet=True)
    with pytest.raises(ValueError, match="exclude each other"):
        run(cfg, console=quiet, fresh=True, resume=True)
    with pytest.raises(RunExists, match="no run to resume"):
        run(cfg, console=quiet, resume=True)
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.json").write_text(cfg.model_dump_json())
    _check_resumable(
        cfg.model_copy(update={"orchestrator": cfg.orchestrator.model_copy(update={"steps": 99})}),
        cfg.run_dir,
    )  # more steps: the same run, continued further
    older = json.loads(cfg.model_dump_json())
    del older["redis"]["password_env"]  # a run saved before that field existed
    (cfg.run_dir / "config.json").write_text(json.dumps(older))
    _check_resumable(cfg, cfg.run_dir)  # resumes: the missing field takes its default
    with pytest.raises(RunExists, match=r"config differs from the run's \(seed\)"):
        run(cfg.model_copy(update={"seed": 7}), console=quiet, resume=True)
    no_aof = cfg.model_copy(update={"redis": cfg.redis.model_copy(update={"aof": False})})
    with pytest.raises(RunExists, match=r"redis\.aof is off"):
        run(no_aof, console=quiet, resume=True)


def test_task_prompts_makes_the_task_a_fixed_training_set_cycled_in_epochs():
    fresh = PromptSource(DataConfig(), CharTokenizer(), max_prompt_tokens=100).batch(12)
    fixed = PromptSource(DataConfig(task_prompts=4), CharTokenizer(), max_prompt_tokens=100)
    epochs = [{i.prompt for i in fixed.batch(4)} for _ in range(3)]
    assert epochs[0] == epochs[1] == epochs[2] == {i.prompt for i in fresh[:4]}
    assert len({i.prompt for i in fresh}) == 12  # without it, no problem comes back
    with pytest.raises(ValueError, match="task_prompts"):
        DataConfig(task_prompts=0)


def test_the_redis_password_comes_from_the_named_environment_variable(monkeypatch):
    from rich.console import Console

    from specrl.orchestrator.run import run

    with pytest.raises(ValidationError, match=r"password_env is for a Redis at redis\.url"):
        RunConfig.model_validate({"redis": {"password_env": "SPECRL_REDIS_PASSWORD"}})
    cfg = RunConfig.model_validate(
        {"redis": {"url": "redis://redis:6379/0", "password_env": "SPECRL_REDIS_PASSWORD"}}
    )
    monkeypatch.delenv("SPECRL_REDIS_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match=r"\$SPECRL_REDIS_PASSWORD is not set"):
        run(cfg, console=Console(quiet=True))  # refused before anything starts
    monkeypatch.setenv("SPECRL_REDIS_PASSWORD", "s3cret")
    assert cfg.redis.password() == "s3cret"
    assert "s3cret" not in cfg.model_dump_json()  # what a run saves as its config.json


def test_comparison_runs_change_one_thing_of_the_main_run(tmp_path):
    """`ar` drops speculation (and the draft-trainer with it), `async` sets lag 1,
    `hybrid` adds history to the draft model (drafting past its k, as `bench history`
    measures it, unless the main run set how far or runs the adaptive controller); all keep
    everything else and live under the main run's directory."""
    from specrl.orchestrator.compare import comparison, describe

    text = f"""
name: m
output_dir: {tmp_path}/{{name}}
orchestrator: {{steps: 9, status_port: 0}}
compare: {{runs: [ar, async, hybrid], steps: 3}}
rollout: {{server: {{speculation: {{method: eagle3, num_speculative_tokens: 4, draft: d}}}}}}
trainer: {{server: {{trainer: {{capture: {{enabled: true}}}}}}}}
draft_trainer: {{enabled: true}}
"""
    main = load_config(_write(tmp_path, text), RunConfig)
    ar, lag1, hybrid = comparison(main, "ar"), comparison(main, "async"), comparison(main, "hybrid")
    labels = (describe(main), describe(ar), describe(lag1), describe(hybrid))
    assert labels == ("eagle3 k=4, lag 0", "AR, lag 0", "eagle3 k=4, lag 1", "eagle3+history k=4, lag 0")
    assert hybrid.rollout.server.speculation.history.hybrid and hybrid.draft_trainer.enabled
    assert not main.rollout.server.speculation.history.hybrid
    assert hybrid.rollout.server.speculation.history.hybrid_max_draft == HISTORY_DRAFT
    adaptive = text.replace("draft: d}", "draft: d, adaptive: {enabled: true}}")
    assert (
        comparison(
            load_config(_write(tmp_path, adaptive), RunConfig), "hybrid"
        ).rollout.server.speculation.history.hybrid_max_draft
        is None
    )
    assert ar.run_dir == tmp_path / "m" / "compare" / "ar" and ar.name == "m-ar"
    assert ar.rollout.server.speculation.method == "none" and not ar.draft_trainer.enabled
    assert lag1.orchestrator.max_lag == 1 and lag1.draft_trainer.enabled
    for c in (ar, lag1, hybrid):
        assert c.orchestrator.steps == 3 and c.orchestrator.status_port is None and not c.compare.runs
        assert c.data == main.data and c.sampling == main.sampling and c.seed == main.seed
        assert c.trainer.server.trainer.optim == main.trainer.server.trainer.optim
    ngram = text.replace("method: eagle3, num_speculative_tokens: 4, draft: d", "method: ngram")
    ngram = ngram.replace("draft_trainer: {enabled: true}", "")
    with pytest.raises(ConfigError, match="'hybrid' adds history to the main run's draft model"):
        load_config(_write(tmp_path, ngram), RunConfig)


@pytest.mark.parametrize("other", ["--fresh", "--resume"])
def test_continue_decides_alone(tmp_path, other):
    """`--continue` chooses between starting and resuming itself: with either, it is a
    usage error (exit 2, which a Kubernetes Job does not retry)."""
    from typer.testing import CliRunner

    from specrl.cli import app

    config = _write(tmp_path, f"output_dir: {tmp_path}/{{name}}\n")
    result = CliRunner().invoke(app, ["run", "--config", str(config), "--continue", other])
    assert result.exit_code == 2 and "give it alone" in " ".join(result.output.split())
    assert not (tmp_path / "specrl").exists(), "nothing may start"


def test_a_service_elsewhere_that_does_not_serve_is_waited_for_then_a_retryable_error(tmp_path):
    """Nothing listens at the rollout address: after `services_timeout_s` the run stops
    before anything starts, naming the service, with exit 75 (a Kubernetes Job retries:
    the service may be a pod starting again)."""
    import time

    from typer.testing import CliRunner

    from specrl.cli import app

    text = f"""
output_dir: {tmp_path}/{{name}}
orchestrator: {{services_timeout_s: 1}}
rollout: {{replicas: 0, addresses: ['127.0.0.1:1']}}
trainer: {{address: '127.0.0.1:1'}}
redis: {{url: 'redis://127.0.0.1:1/0'}}
"""
    t0 = time.monotonic()
    result = CliRunner().invoke(app, ["run", "--config", str(_write(tmp_path, text))])
    said = " ".join(result.output.split())
    assert result.exit_code == 75, said
    assert "rollout server at 127.0.0.1:1 is not serving after 1s (UNAVAILABLE)" in said
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("service", [["rollout"], ["rollout-worker", "--node-rank", "1"]])
def test_a_node_of_a_multi_node_replica_started_alone_needs_node_0s_port(tmp_path, service):
    """Node 1 finds node 0 at its fixed port: port 0 (any free one) is refused by both
    serve commands before anything starts. (`specrl run` with launcher ray picks it.)"""
    from typer.testing import CliRunner

    from specrl.cli import app

    config = _write(tmp_path, "port: 0\nengine: {nnodes: 2, tensor_parallel_size: 2}")
    result = CliRunner().invoke(app, ["serve", *service, "--config", str(config)])
    assert result.exit_code == 2 and "needs a fixed port" in " ".join(result.output.split()), result.output
    server = {"port": 0, "engine": {"nnodes": 2, "tensor_parallel_size": 2}}
    assert (
        RunConfig.model_validate({"launcher": "ray", "rollout": {"server": server}}).rollout.server.port == 0
    )
