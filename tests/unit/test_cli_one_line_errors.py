"""Bad input to ``zsched`` ends in exactly one ``zsched: error:`` line on stderr and exit 2, for
every command (argparse's own errors included), before anything starts or connects."""
from __future__ import annotations

import pytest

from scheduler.shell.cli import main

# a URL that is refused when the command runs: should a check below let its value through, the
# command still ends at once (with another message), never starts
NEVER = "http://127.0.0.1:1"
WORKER = ["worker", "scheduler.shell.demo:worker", "--redis", NEVER]
SCHEDULER = ["scheduler", "--redis", NEVER, "--etcd", "127.0.0.1:1"]
PORT_FIXES = "expected a TCP port number from 1 to 65535"


def _one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as ei:
        code = main(argv)
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert ei.value.code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("zsched: error: "), err
    return lines[0]


@pytest.mark.parametrize("command", [SCHEDULER, WORKER], ids=["scheduler", "worker"])
@pytest.mark.parametrize("port", ["99999", "65536", "0", "-1", "abc", "9100.5", ""])
def test_a_metrics_port_out_of_range_is_refused_in_one_line(command: list[str], port: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line([*command, "--metrics-port", port], capsys)
    assert f"argument --metrics-port: {PORT_FIXES}, got {port!r}" in line
    assert line.endswith(f"(see: zsched {command[0]} --help)")


@pytest.mark.parametrize("command", [SCHEDULER, WORKER], ids=["scheduler", "worker"])
@pytest.mark.parametrize("host", ["0.0.0.0:9100", "http://127.0.0.1", "", "bad host", "-lead.example"])
def test_a_metrics_host_that_is_no_address_is_refused_in_one_line(command: list[str], host: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line([*command, "--metrics-port", "9100", f"--metrics-host={host}"], capsys)
    assert f"argument --metrics-host: expected an IP address or a host name of this machine (e.g. 127.0.0.1), " \
           f"without a port, got {host!r}" in line


@pytest.mark.parametrize("ttl", ["nan", "inf", "0.5", "-5", "86400"])
def test_a_lease_ttl_out_of_range_is_refused_before_connecting(ttl: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line([*SCHEDULER, "--lease-ttl", ttl], capsys)
    assert f"--lease-ttl {float(ttl):g}: the etcd lease TTL must be from 1 to 3600 seconds" in line


@pytest.mark.parametrize("horizon", ["nan", "-1", "86401", "1e9"])
def test_a_due_soon_horizon_out_of_range_is_refused_before_connecting(horizon: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line([*SCHEDULER, "--due-soon-horizon", horizon], capsys)
    assert f"--due-soon-horizon must be from 0 to 86400 seconds, got {float(horizon):g}" in line


@pytest.mark.parametrize("ratio", ["nan", "-0.1", "1.5"])
def test_a_firing_trace_share_out_of_range_is_refused_before_connecting(ratio: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line([*SCHEDULER, "--trace-firing", ratio], capsys)
    assert "--trace-firing must be from 0 to 1 (a share of the firing ticks)" in line


@pytest.mark.parametrize("flag", ["--handoff-lead", "--coalesce-lead", "--burst-lead"])
@pytest.mark.parametrize("ms", ["nan", "-1", "1001", "1e9"])
def test_a_hand_off_lead_out_of_range_is_refused_before_connecting(flag: str, ms: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    line = _one_error_line([*SCHEDULER, flag, ms], capsys)
    assert f"{flag} must be from 0 to 1000 ms, got {float(ms):g}" in line


def test_a_bad_lease_ttl_variable_stops_only_the_scheduler(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZSCHED_LEASE_TTL", "five")
    line = _one_error_line(["dead", "list", "--limit", "0"], capsys)  # another command's own error, not the TTL's
    assert "argument --limit" in line
    refused = "zsched: error: ZSCHED_LEASE_TTL must be a number of seconds, got 'five'"
    assert _one_error_line(SCHEDULER, capsys) == refused
    monkeypatch.setenv("ZSCHED_LEASE_TTL", "0")
    assert "ZSCHED_LEASE_TTL='0': the etcd lease TTL must be from 1" in _one_error_line(SCHEDULER, capsys)


@pytest.mark.parametrize("argv, says", [
    (["nosuchcommand"], "argument COMMAND: invalid choice: 'nosuchcommand'"),
    (["worker"], "the following arguments are required: MODULE:ATTR (see: zsched worker --help)"),
    (["scheduler", "--partitions", "many"], "argument --partitions: invalid int value: 'many'"),
    (["dead", "list", "--limit", "9" * 400], "expected an integer from 1 to 10000"),
    (["stats", "--etcd-timeout", "1e400"], "expected seconds from 0.1 to 60"),
])
def test_argparse_errors_are_one_line_for_every_command(argv: list[str], says: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert says in _one_error_line(argv, capsys)
