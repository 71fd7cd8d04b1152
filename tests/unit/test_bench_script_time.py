"""bench/script_time.py: slow log entries named by script and summed per job."""
from __future__ import annotations

import pytest

from bench.script_time import INSIDE, SCRIPTS_CLIENT, per_job, script_names, tally


def entry(command: bytes | str, us: int, client: bytes = b"127.0.0.1:40000") -> dict[str, object]:
    return {"command": command, "duration": us, "client_address": client}


def test_an_evalsha_is_named_by_its_script_and_the_commands_scripts_ran_apart() -> None:
    names = script_names()
    tick, claim = (next(sha for sha, n in names.items() if n == want) for want in ("tick", "claim"))
    inside = SCRIPTS_CLIENT.encode()
    got = tally([entry(f"EVALSHA {tick} 1 {{bench:0}}:t".encode(), 90), entry(f"EVALSHA {tick} 1 x", 110),
                 entry(f"EVALSHA {claim} 1 x \xa2".encode("latin-1"), 70), entry(b"HGET {bench:0}:c x", 1),
                 entry(b"HGET {bench:0}:q i:0", 2, inside), entry(b"RPOP {bench:0}:r:bench 1", 3, inside),
                 entry("BZPOPMIN a b 1", 7), entry("EVALSHA " + "f" * 40 + " 0", 5)], names)
    assert got == {"tick": [2, 200], "claim": [1, 70], "hget": [1, 1], INSIDE + "hget": [1, 2],
                   INSIDE + "rpop": [1, 3], "bzpopmin": [1, 7], "evalsha ffffffffffff": [1, 5]}


def test_per_job_splits_scripts_their_commands_and_the_clients_commands_dearest_first() -> None:
    counts = {"tick": [60, 6000], "claim": [60, 4500], "ack": [45, 2300], INSIDE + "hget": [500, 450],
              INSIDE + "zadd": [100, 500], "hget": [50, 20], "bzpopmin": [57, 400]}
    out = per_job(counts, 100, {"tick", "claim", "ack", "reap"})
    assert list(out["scripts"]) == ["tick", "claim", "ack"]
    assert out["scripts"]["tick"] == {"calls_per_job": 0.6, "us_per_job": 60.0, "us_per_call": 100.0}
    assert list(out["inside_scripts"]) == ["zadd", "hget"]
    assert out["inside_scripts"]["hget"]["calls_per_job"] == 5.0
    assert list(out["sent_by_clients"]) == ["bzpopmin", "hget"]
    assert out["scripts_us_per_job"] == pytest.approx(128.0)
