# syntax=docker/dockerfile:1
# GPU trainer and draft-trainer: specrl on the official PyTorch CUDA runtime (no vLLM:
# neither service generates). torchrun is on the PATH for multi-node ranks.
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/trainer-gpu.Dockerfile \
#     -t ghcr.io/specrl/specrl-trainer:0.1.0 .
FROM pytorch/pytorch:2.8.0-cuda12.9-cudnn9-runtime AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
RUN python -m pip wheel --no-cache-dir -w /wheels .

FROM pytorch/pytorch:2.8.0-cuda12.9-cudnn9-runtime
COPY --from=build /wheels /wheels
RUN python -m pip install --no-cache-dir --no-index --find-links /wheels specrl==0.1.0 && rm -rf /wheels \
    && useradd --create-home --uid 10001 specrl
USER 10001
WORKDIR /home/specrl
ENV SPECRL_HOME=/opt/specrl/home \
    SPECRL_HEALTH_ADDRESS=127.0.0.1:50061
HEALTHCHECK --interval=30s --timeout=10s --start-period=1800s \
    CMD ["specrl", "health", "--timeout", "5"]
ENTRYPOINT ["specrl"]
CMD ["serve", "trainer", "--config", "/etc/specrl/trainer.yaml"]
