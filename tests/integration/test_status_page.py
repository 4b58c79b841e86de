"""The orchestrator's status page and control API, served by the real uvicorn on loopback
and loaded in a real headless Chromium (Debian chromium + chromium-driver, driven by
Selenium). The status here is fed step records of the shape the loop writes; the page
against a live `specrl run` is in tests/deploy/test_chart_services.py."""

from __future__ import annotations

import socket
import time

import pytest

from specrl.orchestrator.status import StatusPage

from helpers import ARTIFACTS, browser, http_json, wait_for

TOKEN = "t0ken"


def _record(step: int) -> dict:
    time_ = {"data": 0.1, "prepare": 0.2, "exposed_generation": 1.5 + step, "logprob": 0.4, "train": 0.9}
    time_ |= {"checkpoint": 0.0, "other": 0.05, "gen": 1.6, "reward": 0.01, "step": 3.2}
    return {
        "step": step,
        "time": time_,
        "acceptance_length": 2.0 + 0.1 * step,
        "reward_mean": 0.5,
        "draft": {"version": step},
    }


def _nobody() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def page():
    page = StatusPage("tiny", 5, [_nobody()], port=0, token=TOKEN)
    page.status.running(0)
    for step in range(3):
        page.status.on_step(_record(step), checkpoint=None)
    yield page
    page.stop()


def call(page: StatusPage, path: str, *, method: str = "GET", token: str | None = None) -> tuple[int, dict]:
    return http_json(page.port, path, method=method, token=token)


def test_status_json_and_a_control_api_that_needs_the_token(page):
    code, s = call(page, "/api/status")
    assert code == 200
    assert (s["run"], s["state"], s["step"], s["steps"], s["draft_version"]) == ("tiny", "running", 3, 5, 2)
    assert [r["step"] for r in s["recent"]] == [0, 1, 2] and s["acceptance_length"] == pytest.approx(2.2)
    assert s["replicas"] == [{"address": page.status.replicas[0], "health": "UNAVAILABLE"}]
    assert call(page, "/healthz") == (200, {"state": "running"})
    assert call(page, "/api/pause", method="POST")[0] == 401
    assert call(page, "/api/pause", method="POST", token="nope")[0] == 403
    assert not page.control.paused  # refused calls change nothing
    assert call(page, "/api/pause", method="POST", token=TOKEN) == (200, {"state": "pausing"})
    assert page.control.paused and call(page, "/api/status")[1]["state"] == "pausing"
    assert call(page, "/api/checkpoint", method="POST", token=TOKEN)[0] == 200
    assert page.control.take_checkpoint_request() and not page.control.take_checkpoint_request()
    assert call(page, "/api/resume", method="POST", token=TOKEN) == (200, {"state": "running"})


def test_the_loop_waits_while_paused_and_goes_on_when_resumed(page):
    import threading

    page.control.pause()
    done = threading.Event()
    checks = []
    waiter = threading.Thread(
        target=lambda: (page.control.wait_while_paused(lambda: checks.append(1), poll_s=0.05), done.set())
    )
    waiter.start()
    time.sleep(0.5)
    assert not done.is_set() and checks  # liveness checked while waiting
    assert call(page, "/api/status")[1]["state"] == "paused"
    page.control.resume()
    waiter.join(timeout=5)
    assert done.is_set()


def test_the_page_shows_live_numbers_and_draws_the_stage_chart(page):
    from selenium.webdriver.common.by import By

    b = browser()
    try:
        b.get(f"http://127.0.0.1:{page.port}/")
        wait_for(lambda: b.find_element(By.ID, "step").text == "3 / 5")
        assert b.find_element(By.ID, "run").text == "tiny"
        assert b.find_element(By.ID, "accept").text == "2.20"
        # 3 steps x 6 stages with time (checkpoint took none) drawn as SVG rectangles,
        # exposed generation growing step by step
        rects = wait_for(lambda: b.find_elements(By.CSS_SELECTOR, "#stages rect"))
        assert len(rects) == 3 * 6
        exposed = [
            float(r.get_attribute("height"))
            for r in rects
            if r.get_attribute("data-stage") == "exposed_generation"
        ]
        assert exposed == sorted(exposed) and exposed[0] < exposed[-1]
        assert "UNAVAILABLE" in b.find_element(By.ID, "replicas").text
        page.status.on_step(_record(3), checkpoint="/runs/tiny/checkpoint")  # the loop goes on
        wait_for(lambda: b.find_element(By.ID, "step").text == "4 / 5")  # the page follows
        assert len(b.find_elements(By.CSS_SELECTOR, "#stages rect")) == 4 * 6
        # the control buttons: the token typed in, pause through the page
        b.find_element(By.ID, "token").send_keys(TOKEN)
        b.find_element(By.CSS_SELECTOR, "button[data-action=pause]").click()
        wait_for(lambda: page.control.paused)
        wait_for(lambda: "pausing" in b.find_element(By.ID, "state").text)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert b.save_screenshot(str(ARTIFACTS / "status-page.png"))
    finally:
        b.quit()


@pytest.mark.timed
def test_replica_health_is_asked_at_most_once_per_interval_and_at_once_for_new_replicas():
    """A real gRPC health service whose status changes: the cache answers from its last
    asking within `max_age_s`, asks again after it, and at once when the replicas change."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from specrl.orchestrator.status import HealthCache

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        cache = HealthCache(max_age_s=1.0)
        assert cache.get([address]) == [{"address": address, "health": "SERVING"}]
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert cache.get([address])[0]["health"] == "SERVING", "asked again within max_age_s"
        time.sleep(1.1)
        assert cache.get([address])[0]["health"] == "NOT_SERVING"
        gone = "127.0.0.1:1"  # nothing listens there
        assert [h["health"] for h in cache.get([address, gone])] == ["NOT_SERVING", "UNAVAILABLE"]
    finally:
        server.stop(0)
