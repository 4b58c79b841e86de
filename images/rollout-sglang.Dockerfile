# syntax=docker/dockerfile:1
# GPU rollout server on SGLang (the SGLang engine adapter; its CPU backend cannot run on
# our CPU machines, so this variant is exercised on GPU clusters only).
#   docker buildx build --platform linux/amd64,linux/arm64 -f images/rollout-sglang.Dockerfile \
#     -t ghcr.io/specrl/specrl-rollout-sglang:0.1.0 .
FROM lmsysorg/sglang:v0.5.3-cu129 AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY services ./services
RUN python3 -m pip wheel --no-cache-dir --no-deps -w /wheels .

FROM lmsysorg/sglang:v0.5.3-cu129
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
