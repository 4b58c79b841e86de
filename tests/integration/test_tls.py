"""Mutual TLS on specrl's gRPC (SPECRL_TLS_*): a real gRPC server started the way the
trainer and the draft-trainer start theirs, asked for its health by the real client code,
with certificates made here by a CA of the test's own. A client without a certificate, or
with one from another CA, gets nothing; the whole system under mutual TLS runs in
tests/deploy/test_chart_services.py."""

from __future__ import annotations

import pytest

from specrl import grpc_options, serving

from helpers import make_certificates, tls_env


@pytest.fixture
def server(tmp_path, monkeypatch):
    files = make_certificates(tmp_path / "pki")
    for name, value in tls_env(files).items():
        monkeypatch.setenv(name, value)
    srv, port = serving.start(lambda s: None, "specrl.v1.Test", "127.0.0.1", 0)
    yield f"127.0.0.1:{port}", files
    srv.stop(0)


def test_a_client_with_a_certificate_of_the_ca_is_served(server):
    address, _ = server
    assert serving.health_of(address, timeout=10) == "SERVING"


def test_a_client_without_a_certificate_gets_nothing(server, monkeypatch):
    address, _ = server
    for name in grpc_options.TLS_ENV:
        monkeypatch.delenv(name)
    assert serving.health_of(address, timeout=5) == "UNAVAILABLE"  # plaintext to a TLS port


def test_a_client_certificate_from_another_ca_is_refused(server, tmp_path, monkeypatch):
    """The client trusts the server (same CA file) but presents a certificate the
    server's CA did not sign: the server requires client certificates of its CA."""
    address, _ = server
    other = make_certificates(tmp_path / "other")
    monkeypatch.setenv("SPECRL_TLS_CERT", str(other["cert"]))
    monkeypatch.setenv("SPECRL_TLS_KEY", str(other["key"]))
    assert serving.health_of(address, timeout=5) == "UNAVAILABLE"


def test_incomplete_tls_settings_are_refused_with_what_is_missing(tmp_path, monkeypatch):
    files = make_certificates(tmp_path / "pki")
    monkeypatch.setenv("SPECRL_TLS_CERT", str(files["cert"]))
    monkeypatch.delenv("SPECRL_TLS_KEY", raising=False)
    monkeypatch.delenv("SPECRL_TLS_CA", raising=False)
    with pytest.raises(grpc_options.TLSConfigError, match="SPECRL_TLS_KEY, SPECRL_TLS_CA not set"):
        grpc_options.channel("127.0.0.1:1")
    monkeypatch.setenv("SPECRL_TLS_KEY", str(tmp_path / "missing.key"))
    monkeypatch.setenv("SPECRL_TLS_CA", str(files["ca"]))
    with pytest.raises(grpc_options.TLSConfigError, match=r"cannot read .*missing\.key"):
        grpc_options.channel("127.0.0.1:1")
