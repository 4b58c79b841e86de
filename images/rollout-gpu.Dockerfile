# syntax=docker/dockerfile:1
# GPU rollout server: specrl on the official vLLM image (CUDA, EAGLE-3 / draft-model /
# MTP / n-gram speculation). Multi-arch (GB200 nodes are arm64):
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/rollout-gpu.Dockerfile \
#     -t ghcr.io/specrl/specrl-rollout:0.1.0 .
FROM vllm/vllm-openai:v0.11.0 AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
# vLLM comes with the base image: specrl and its own dependencies only
RUN python3 -m pip wheel --no-cache-dir --no-deps -w /wheels .

FROM vllm/vllm-openai:v0.11.0
COPY --from=build /wheels /wheels
RUN python3 -m pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --create-home --uid 10001 specrl
USER 10001
WORKDIR /home/specrl
ENV SPECRL_HOME=/opt/specrl/home \
    SPECRL_HEALTH_ADDRESS=127.0.0.1:50051
HEALTHCHECK --interval=30s --timeout=10s --start-period=1800s \
    CMD ["specrl", "health", "--timeout", "5"]
ENTRYPOINT ["specrl"]
CMD ["serve", "rollout", "--config", "/etc/specrl/rollout.yaml"]
