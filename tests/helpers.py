"""Helpers the tests share: configs of real servers and runs, models with weights chosen
for a property, polling, HTTP, certificates, and the external tools the deploy and
status-page tests drive. Fixtures live in conftest.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from specrl.config import RolloutServerConfig
from specrl.launcher import ServiceProcess

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str, *, installs: str) -> str:
    """The path of an external tool a test drives (.tools/bin, the venv, PATH). Missing, it
    fails the test, since `make test` promises every test runs; under `make test-fast`
    (SPECRL_TEST_SKIP_MISSING_TOOLS=1, for a machine without them) it skips it, saying
    which tool and what installs it."""
    for candidate in (ROOT / ".tools" / "bin" / name, Path(sys.executable).with_name(name)):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    why = f"{name} is not installed here ({installs})"
    if os.environ.get("SPECRL_TEST_SKIP_MISSING_TOOLS"):
        pytest.skip(why)
    pytest.fail(why)


class ServerPool:
    """Keeps at most one rollout server alive; a request for another config stops it."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._proc: ServiceProcess | None = None

    def get(self, cfg: RolloutServerConfig, env: dict[str, str] | None = None) -> ServiceProcess:
        key = json.dumps([cfg.model_dump(mode="json"), env or {}], sort_keys=True)
        if key != self._key:
            self.close()
            self._proc = ServiceProcess(cfg, env=env).start()
            self._key = key
        assert self._proc is not None
        return self._proc

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stop()
        self._proc, self._key = None, None


def server_config(
    method: str = "none", k: int = 3, draft: str | None = None, speculation: dict | None = None, **kw
) -> RolloutServerConfig:
    """A zoo rollout-server config (float32: the exact reference is computed in float32);
    `speculation` adds keys to its speculation section."""
    spec = {"method": method, "num_speculative_tokens": k, **(speculation or {})}
    if draft:
        spec["draft"] = draft
    return RolloutServerConfig.model_validate(
        {"port": 0, "engine": {"model": "zoo:target", "dtype": "float32"}, "speculation": spec, **kw}
    )


def greedy_continuation(model, ids: list[int], tokens: int) -> list[int]:
    """An HF model's greedy continuation of `ids`, computed apart from any engine (no stop)."""
    import torch

    out: list[int] = []
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(input_ids=torch.tensor([ids + out])).logits[0, -1]
            out.append(int(logits.argmax()))
    return out


def tiny_qwen3(path, *, layers: int = 2, kv_heads: int = 2) -> None:
    """A random Qwen3 small enough for multi-process trainer tests (4 heads, 2 KV heads:
    splits across tp=2; 1 KV head: replicated across tp=2, like the zoo target), saved in
    HF format."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=16, max_position_embeddings=128,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(str(path))


def random_like(state: dict, seed: int = 0) -> dict:
    """`state` with every float tensor replaced by small random values (int and bool
    buffers, like an EAGLE-3 head's vocabulary maps, kept): a draft whose proposals the
    target almost never accepts."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = dict(state)
    for name, t in state.items():
        if t.is_floating_point():
            out[name] = torch.randn(t.shape, generator=g) * 0.05
    return out


def random_weights(out: Path, like: str) -> str:
    """A servable copy of model `like` (config, tokenizer) with random weights
    (`random_like`), for a property no trained model guarantees on every build: an
    EAGLE-3 head of it proposes drafts the target almost never accepts (they cost
    verification on any machine); a target of it is unsure of every next token."""
    from safetensors.torch import load_file, save_file

    from specrl.config import resolve_model_path

    src = Path(resolve_model_path(like))
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    save_file(random_like(load_file(str(src / "model.safetensors"))), str(out / "model.safetensors"))
    return str(out)


def tiny_rollouts(n: int = 8, seed: int = 1) -> list:
    """Random prompts and completions with rollout logprobs; every third one rewarded."""
    import torch

    from specrl.trainer.api import Rollout

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p = torch.randint(1, 64, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        c = torch.randint(1, 64, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g).tolist()
        lp = (-torch.rand(len(c), generator=g) * 3).tolist()
        out.append(Rollout(p, c, reward=float(i % 3 == 0), rollout_logprobs=lp))
    return out


def tiny_run_config(tmp_path, **orchestrator) -> dict:
    """A small `specrl run` config on the zoo: one EAGLE-3 replica, one trainer rank."""
    return {
        "name": "t",
        "output_dir": str(tmp_path / "{name}"),
        "data": {"prompts_per_step": 4, "task_max_terms": 2},
        "sampling": {"n": 4, "max_tokens": 32},
        "orchestrator": {"concurrency": 4, **orchestrator},
        "rollout": {
            "server": {
                "port": 0,
                "engine": {
                    "model": "zoo:target",
                    "dtype": "float32",
                    "max_model_len": 128,
                    "kv_cache_gib": 0.25,
                },
                "speculation": {
                    "method": "eagle3",
                    "num_speculative_tokens": 3,
                    "draft": "zoo:eagle3-domain",
                },
                "self_test": {"enabled": False},
            }
        },
        "trainer": {"server": {"port": 0, "trainer": {"micro_batch_size": 16, "optim": {"lr": 1e-4}}}},
    }


def system_run(
    root, name: str, *, adapt: bool = False, steps: int = 3, compare: tuple[str, ...] = (),
    draft: str = "zoo:eagle3-generic",
):  # fmt: skip
    """A short synchronous `specrl run` with EAGLE-3, every service a real process: 16
    prompts x 8 samples per step at lr 3e-5, the same seeds and prompts in every run (and
    in its comparison runs, `compare`). EAGLE-3 starts from `draft` (the generic-init
    one), frozen or (adapt) adapted online by the draft-trainer on the trainer's captured
    features. Returns the `RunResult`."""
    from rich.console import Console

    from specrl.config import RunConfig
    from specrl.orchestrator.run import run

    cfg = tiny_run_config(root, steps=steps, max_lag=0, concurrency=8)
    cfg["name"] = name
    cfg["data"]["prompts_per_step"] = 16
    cfg["sampling"]["n"] = 8
    cfg["compare"] = {"runs": list(compare), "steps": steps}
    trainer = cfg["trainer"]["server"]["trainer"]
    trainer["optim"]["lr"] = 3e-5  # the demo's first steps: little drift in 3 steps
    cfg["rollout"]["server"]["speculation"]["draft"] = draft
    if adapt:
        trainer["capture"] = {"enabled": True}
        training = {"lr": 1e-3, "holdout_every": 5}
        cfg["draft_trainer"] = {"enabled": True, "server": {"port": 0, "training": training}}
    return run(RunConfig.model_validate(cfg), console=Console(quiet=True), metrics=False)


ARTIFACTS = Path(os.environ.get("SPECRL_TEST_ARTIFACTS", ROOT / "test-artifacts"))
T = TypeVar("T")


def browser():
    """Headless Chromium through Selenium, with the Debian chromedriver (no download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = tool("chromium", installs="`make setup`: apt-get chromium")
    driver = tool("chromedriver", installs="`make setup`: apt-get chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,900"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


def wait_for(fn: Callable[[], T], timeout_s: float = 20.0, what: str = "") -> T:
    """Poll `fn` until it returns something true; that value."""
    deadline = time.monotonic() + timeout_s
    while not (value := fn()):
        assert time.monotonic() < deadline, f"timed out waiting for {what or fn}"
        time.sleep(0.2)
    return value


def metrics_text(proc: ServiceProcess) -> str:
    """The Prometheus exposition a service serves on its metrics port."""
    return urllib.request.urlopen(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=10).read().decode()


def http_json(port: int, path: str, *, method: str = "GET", token: str | None = None) -> tuple[int, dict]:
    """`method` `path` on 127.0.0.1:`port` (a bearer `token` if given): (HTTP status, JSON)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def make_certificates(root: Path, *, name: str = "specrl") -> dict[str, Path]:
    """A CA and one certificate it signs (SAN `name`, for servers and clients alike, as
    the chart's cert-manager Certificate), PEM files under `root`: ca.crt, tls.crt, tls.key."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    days = datetime.timedelta(days=1)

    def build(subject: str, key, issuer: str, signer, *, ca: bool) -> x509.Certificate:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - days)
            .not_valid_after(now + days)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = build(f"{name} test CA", ca_key, f"{name} test CA", ca_key, ca=True)
    cert = build(name, key, f"{name} test CA", ca_key, ca=False)
    root.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    files = {"ca": root / "ca.crt", "cert": root / "tls.crt", "key": root / "tls.key"}
    files["ca"].write_bytes(ca.public_bytes(pem))
    files["cert"].write_bytes(cert.public_bytes(pem))
    files["key"].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


def tls_env(files: dict[str, Path]) -> dict[str, str]:
    """The environment that turns specrl's mutual TLS on with `files`."""
    return {
        "SPECRL_TLS_CERT": str(files["cert"]),
        "SPECRL_TLS_KEY": str(files["key"]),
        "SPECRL_TLS_CA": str(files["ca"]),
    }


CONTROL_TOKEN = "test-control-token"  # the status page's control API in tests


class SpecrlRun:
    """`specrl run` as a child process, its terminal output in a file (a pipe nobody
    reads could fill and stall it)."""

    def __init__(self, config: Path, *flags: str) -> None:
        self.log = config.parent / f"run-{len(list(config.parent.glob('run-*.out')))}.out"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specrl.cli", "run", "--config", str(config), *flags],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "SPECRL_CONTROL_TOKEN": CONTROL_TOKEN},
            )

    def output(self) -> str:
        return self.log.read_text()

    def says(self, phrase: str) -> bool:
        """Whether the output holds `phrase`, wherever rich broke its lines (a file is no
        terminal: rich wraps at 80 columns, where the run directory's length decides)."""
        return phrase in " ".join(self.output().split())

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def wait_resumed(self) -> None:
        """Until `--resume` has cut the step log back to the checkpoint (or the run ended):
        steps are counted from then. Counted before, the killed run's steps past its
        checkpoint were taken for the new run's, and the next fault struck a run whose
        services were not up yet (seen once: a pause that landed two steps late)."""
        wait_for(lambda: self.says("resumed at version") or self.proc.poll() is not None, 300, "the resume")

    def pause(self) -> None:
        """Hold the loop at its next step boundary (the status page's control API)."""
        port = int(re.search(r"status page on :(\d+)", " ".join(self.output().split())).group(1))
        assert http_json(port, "/api/pause", method="POST", token=CONTROL_TOKEN)[0] == 200
        wait_for(lambda: http_json(port, "/api/status")[1]["state"] == "paused", 120, "the pause")


def run_steps(run_dir: Path) -> list[dict]:
    path = run_dir / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_steps(run: SpecrlRun, run_dir: Path, n: int, timeout: float = 900) -> list[dict]:
    deadline = time.monotonic() + timeout
    while len(records := run_steps(run_dir)) < n:
        if run.proc.poll() is not None:
            pytest.fail(f"specrl run exited with {run.proc.returncode} before step {n}:\n{run.output()}")
        if time.monotonic() > deadline:
            run.proc.kill()
            pytest.fail(f"no step {n} after {timeout}s")
        time.sleep(0.5)
    return records
