"""A private CA and a server certificate for 127.0.0.1, made with openssl, for the TLS tests
(redis-server with ``--tls-port``, ``zsched ui --tls-cert``)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def make_certs(d: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) written into ``d``."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=zsched-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf")
    return d / "ca.pem", d / "server.pem", d / "server.key"
