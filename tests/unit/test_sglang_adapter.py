"""The SGLang adapter's HTTP client against a FAKE SGLang server (SGLang cannot run on
these machines): checks the request bodies follow SGLang 0.5.23's API and that a refusal
(`success: false`) surfaces as an error. SGLang itself is not tested here."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch

from specrl.weightsync.sglang import SGLangError, SGLangReplica, manifest_lists


@pytest.fixture
def fake_sglang():
    calls: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            calls.append((self.path, body))
            ok = body.get("group_name") != "refused"
            payload = json.dumps({"success": ok, "message": "" if ok else "group exists"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", calls
    server.shutdown()


def test_requests_follow_sglang_api(fake_sglang):
    url, calls = fake_sglang
    replica = SGLangReplica(url, timeout_s=10)
    replica.init_group(
        host="10.0.0.1", port=29500, rank_offset=1, world_size=3, group_name="policy-7", backend="nccl"
    )
    replica.pause()
    replica.begin_update("draft")
    names, dtypes, shapes = manifest_lists(
        [("w", torch.zeros(2, 3)), ("b", torch.zeros(3, dtype=torch.bfloat16))]
    )
    replica.update_from_distributed(names, dtypes, shapes, kind="draft", group_name="policy-7", version=4)
    replica.end_update()
    replica.resume()
    replica.destroy_group("policy-7")
    assert [p for p, _ in calls] == [
        "/init_weights_update_group",
        "/pause_generation",
        "/begin_weight_update",
        "/update_weights_from_distributed",
        "/end_weight_update",
        "/continue_generation",
        "/destroy_weights_update_group",
    ]
    assert calls[1][1] == {"mode": "abort"} and calls[2][1] == {"selector": "draft"}
    assert calls[0][1] == {
        "master_address": "10.0.0.1",
        "master_port": 29500,
        "rank_offset": 1,
        "world_size": 3,
        "group_name": "policy-7",
        "backend": "nccl",
    }
    assert calls[3][1] == {
        "names": ["w", "b"],
        "dtypes": ["float32", "bfloat16"],
        "shapes": [[2, 3], [3]],
        "group_name": "policy-7",
        "flush_cache": True,
        "weight_version": "4",
        "selector": "draft",
    }
    with pytest.raises(ValueError, match="pause mode"):
        replica.pause("wait")


def test_refusal_is_an_error(fake_sglang):
    url, _ = fake_sglang
    with pytest.raises(SGLangError, match="group exists"):
        SGLangReplica(url).destroy_group("refused")
