"""``zsched ui``'s own checks, in-process: argument errors are one line (exit 2), TLS files that
cannot serve are one line (exit 4) before anything binds or connects, and each way a socket can
fail to listen has its message and exit code."""
from __future__ import annotations

import errno
import socket
import subprocess
from pathlib import Path

import pytest

from scheduler.shell.cli import main
from scheduler.shell.cli_errors import EXIT_BAD_INPUT, EXIT_LOCAL
from scheduler.shell.cli_ui import bind_host, listen, listen_error

DEAD_REDIS = "redis://127.0.0.1:1/0"  # never reached: each case stops before connecting


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        code = main(["ui", "--redis", DEAD_REDIS, *args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)


@pytest.fixture
def tls_files(tmp_path: Path) -> Path:
    """a.pem/a.key and b.key (self-signed, unencrypted), enc.pem/enc.key (key under a passphrase), junk.pem."""
    for name in ("a", "b"):
        openssl(tmp_path, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "1", "-subj", f"/CN={name}")
    openssl(tmp_path, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-keyout", "enc.key",
            "-out", "enc.pem", "-days", "1", "-subj", "/CN=enc", "-passout", "pass:secret")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    return tmp_path


def test_argument_errors_are_one_line_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for args, says in [
        (["--host", "999.1.1.1"], "neither an IPv4 address nor a host name"),
        (["--host", "127.0.0.1:8089"], "carries a port"),
        (["--host", ""], "is not a host name"),
        (["--allowed-host", "console example"], "is not a host name"),
        (["--allowed-host", "*"], "no wildcards"),
        (["--allowed-host", "::1"], "in brackets"),
        (["--trust-proxy", "the-proxy"], "is not an IP address or network"),
        (["--port", "70000"], "expected a port from 0 to 65535"),
    ]:
        code, err = run(capsys, *args)
        lines = err.splitlines()
        assert code == EXIT_BAD_INPUT and len(lines) == 1, (args, err)
        assert lines[0].startswith("zsched: error: argument ") and says in lines[0], (args, err)
        assert lines[0].endswith("(see: zsched ui --help)")


def test_tls_files_that_cannot_serve_are_one_line_with_exit_4(capsys: pytest.CaptureFixture[str],
                                                              tls_files: Path) -> None:
    d = tls_files
    for cert, key, code, says in [
        ("a.pem", "b.key", EXIT_LOCAL, "the key does not belong to the certificate"),
        ("junk.pem", "a.key", EXIT_LOCAL, "expected a PEM certificate (chain) and its PEM private key"),
        ("a.pem", "junk.pem", EXIT_LOCAL, "expected a PEM certificate"),
        ("enc.pem", "enc.key", EXIT_LOCAL, "not encrypted"),  # refused, not a passphrase prompt
        ("missing.pem", "a.key", EXIT_LOCAL, "cannot read --tls-cert"),
        (".", "a.key", EXIT_LOCAL, "cannot read --tls-cert"),
    ]:
        code_seen, err = run(capsys, "--tls-cert", str(d / cert), "--tls-key", str(d / key))
        lines = err.splitlines()
        assert code_seen == code and len(lines) == 1 and says in lines[0], (cert, key, err)
    code_seen, err = run(capsys, "--tls-key", str(d / "a.key"))
    assert code_seen == EXIT_BAD_INPUT and "--tls-cert and --tls-key go together" in err


def test_each_way_a_socket_cannot_listen_has_its_message_and_exit_code() -> None:
    assert listen_error(OSError(errno.EADDRINUSE, "in use"), "127.0.0.1", 8089) == (
        "cannot listen on 127.0.0.1:8089: the port is in use (choose another with --port, --port 0 for a free one, "
        "or stop the process that has it)", EXIT_LOCAL)
    msg, code = listen_error(OSError(errno.EADDRNOTAVAIL, "not here"), "::5", 8089)
    assert code == EXIT_BAD_INPUT
    assert msg.startswith("cannot listen on [::5]:8089: ::5 is not an address of this machine")
    msg, code = listen_error(OSError(errno.EACCES, "denied"), "127.0.0.1", 443)
    assert code == EXIT_LOCAL and "ports below 1024 need privileges" in msg
    msg, code = listen_error(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "gone.invalid", 1)
    assert code == EXIT_BAD_INPUT and "does not resolve" in msg


def test_hosts_to_bind_are_addresses_or_names_that_resolve_and_port_0_is_one_free_port() -> None:
    assert bind_host("[::1]") == "::1" and bind_host("127.0.0.1") == "127.0.0.1"
    assert bind_host("LOCALHOST") == "localhost"
    for bad in ("1.2.3", "999.1.1.1", "no-such-host.invalid", "localhost:1"):
        with pytest.raises(ValueError):
            bind_host(bad)
    socks = listen("localhost", 0)
    try:
        ports = {s.getsockname()[1] for s in socks}
        assert len(ports) == 1 and 0 not in ports, "every address of the name on one free port"
        with pytest.raises(OSError) as taken:
            listen("127.0.0.1", ports.pop())
        assert taken.value.errno == errno.EADDRINUSE
    finally:
        for s in socks:
            s.close()
