"""Generated gRPC code is committed; it must match proto/ (run `make proto`)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_up_to_date(tmp_path):
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proto").rglob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            *protos,
        ],
        cwd=ROOT,
        check=True,
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated
    for rel in generated:
        committed = ROOT / "services" / rel
        assert committed.exists(), f"{rel} is not committed: run `make proto`"
        assert committed.read_text() == (tmp_path / rel).read_text(), f"{rel} is stale: run `make proto`"
