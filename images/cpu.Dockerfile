# All-in-one CPU image: every specrl service with vLLM's CPU build and the tiny zoo tools.
# Build from the repository root: docker build -f images/cpu.Dockerfile -t specrl:cpu .
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends make redis-server \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/specrl
COPY pyproject.toml README.md Makefile ./
COPY scripts ./scripts
COPY proto ./proto
COPY services ./services
RUN bash scripts/setup.sh

RUN useradd --create-home --uid 10001 specrl
USER 10001
ENV PATH=/opt/specrl/.venv/bin:$PATH \
    SPECRL_HOME=/home/specrl/.cache/specrl
ENTRYPOINT ["specrl"]
CMD ["--help"]
