"""A test that drives an external tool (helm, promtool, chromium, ...) fails when the tool
is missing, since `make test` promises every test runs, and is skipped, naming the tool
and what installs it, under `make test-fast` on a machine without it."""

from __future__ import annotations

import pytest

from helpers import tool

MISSING = "specrl-no-such-tool"


def test_a_missing_tool_fails_the_test(monkeypatch):
    monkeypatch.delenv("SPECRL_TEST_SKIP_MISSING_TOOLS", raising=False)
    with pytest.raises(pytest.fail.Exception, match=f"{MISSING} is not installed here \\(apt-get it\\)"):
        tool(MISSING, installs="apt-get it")


def test_under_test_fast_a_missing_tool_skips_the_test_with_its_name(monkeypatch):
    monkeypatch.setenv("SPECRL_TEST_SKIP_MISSING_TOOLS", "1")
    with pytest.raises(pytest.skip.Exception, match=f"{MISSING} is not installed here"):
        tool(MISSING, installs="apt-get it")


def test_an_installed_tool_is_found():
    assert tool("helm", installs="`make setup`").endswith("helm")
