# syntax=docker/dockerfile:1
# GPU images: the rollout server (target `rollout`), the trainer and draft-trainer
# (target `trainer`), and the Ray nodes that run all of them as actors (target `ray`,
# deploy/ray), all on the official vLLM image. One base on purpose: policy and
# draft weights travel over NCCL groups that join trainer and rollout processes, so both
# sides run the same torch and NCCL build. The tag is the vLLM release line specrl's engine
# code supports (SUPPORTED_RELEASE in services/specrl/rollout/engines/vllm; the rollout
# server refuses another at startup); vLLM's tags are multi-arch, linux/amd64 and
# linux/arm64 (GB200's Grace CPUs are arm64). torchrun comes with the base's torch.
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/gpu.Dockerfile \
#     --target rollout -t ghcr.io/specrl/specrl-rollout:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/gpu.Dockerfile \
#     --target trainer -t ghcr.io/specrl/specrl-trainer:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/gpu.Dockerfile \
#     --target ray -t ghcr.io/specrl/specrl-ray:0.1.0 .
FROM vllm/vllm-openai:v0.32.0 AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
# vLLM and torch come with the base image: specrl and its own dependencies only
RUN python3 -m pip wheel --no-cache-dir --no-deps -w /wheels .
# Arctic Inference's suffix trees (drafting from history; scripts/setup.sh says why): PyPI
# has source only, built against the base's torch; the compiler is the base release's.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m pip install --no-cache-dir setuptools==80.9.0 wheel==0.45.1 ninja==1.13.0 \
        cmake==4.1.0 nanobind==2.9.2 \
    && python3 -m pip wheel --no-cache-dir --no-deps --no-build-isolation -w /wheels \
        arctic-inference==0.3.0

FROM vllm/vllm-openai:v0.32.0 AS runtime
COPY --from=build /wheels /wheels
RUN python3 -m pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --create-home --uid 10001 specrl
USER 10001
WORKDIR /home/specrl
ENV SPECRL_HOME=/opt/specrl/home
HEALTHCHECK --interval=30s --timeout=10s --start-period=1800s \
    CMD ["specrl", "health", "--timeout", "5"]
ENTRYPOINT ["specrl"]

FROM runtime AS trainer
ENV SPECRL_HEALTH_ADDRESS=127.0.0.1:50061
CMD ["serve", "trainer", "--config", "/etc/specrl/trainer.yaml"]

FROM runtime AS rollout
ENV SPECRL_HEALTH_ADDRESS=127.0.0.1:50051
CMD ["serve", "rollout", "--config", "/etc/specrl/rollout.yaml"]

# A KubeRay head or worker (deploy/ray): `launcher: ray` runs every service as an actor
# on these nodes. KubeRay runs `ray start` itself (no entrypoint); ray[default] brings the
# dashboard's job server, which a RayJob submits to. RAY_VERSION: rayVersion in deploy/ray.
FROM runtime AS ray
ARG RAY_VERSION=2.60.0
USER 0
RUN python3 -m pip install --no-cache-dir "ray[default]==${RAY_VERSION}"
USER 10001
ENTRYPOINT []
CMD ["ray", "--help"]
