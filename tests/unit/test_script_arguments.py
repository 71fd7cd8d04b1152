"""The scripts' argument checks (lua/_lib_args.lua) against the Python side: the headers document
what each script refuses, the limits are the Python limits, a refusal maps to ScriptArgumentError,
and the checks run on fakeredis (Lua 5.1 in lupa) as on Redis."""
from __future__ import annotations

import importlib
import inspect
import re
from datetime import timedelta
from pathlib import Path

import fakeredis
import pytest
from redis.exceptions import ResponseError

from scheduler import Client, ScriptArgumentError
from scheduler.protocol import calls, codec, cron, listing, options, timeutil
from scheduler.protocol.codes import script_error
from scheduler.protocol.keys import validate_name
from scheduler.protocol.scripts import SCRIPT_NAMES
from tests.support.helpers import raw_call

LUA = Path(__file__).resolve().parents[2] / "lua"


def source(name: str) -> str:
    return (LUA / f"{name}.lua").read_text("utf-8")


def header(name: str) -> str:
    return "\n".join(line for line in source(name).splitlines() if line.startswith("--"))


def test_every_script_header_says_what_it_refuses_and_names_every_argument_it_checks() -> None:
    missing = []
    for name in SCRIPT_NAMES:
        text = header(name)
        if "-- Refuses (ZSCHED_ARG" not in text:
            missing.append(f"lua/{name}.lua: no '-- Refuses (ZSCHED_ARG...' in its header")
        # arg('int', 5, 'tombstone_ttl_ms', ...): the name a refusal reports must be in the header
        for checked in re.findall(r"arg\('(?:int|num|name|flag|at)', [^,]+, '(\w+)'", source(name)):
            if checked not in text.replace(" ", "_") and checked.replace("_", " ") not in text:
                missing.append(f"lua/{name}.lua: checks {checked!r} but its header does not name it")
    assert not missing, "\n".join(missing)


def limits() -> tuple[int, ...]:
    m = re.search(r"^local NAME_MAX, KEY_MAX, BATCH_MAX = (\d+), (\d+), (\d+)$", source("_lib_args"), re.M)
    assert m
    return tuple(int(x) for x in m.groups())


def lua_constant(name: str) -> int:
    m = re.search(rf"^local {name} = (\d+)", source("_lib_args"), re.M)
    assert m, name
    return int(m.group(1))


def test_the_limits_are_the_python_ones() -> None:
    assert lua_constant("MAX_MS") == timeutil.MAX_MS
    assert lua_constant("MAX_INT") == 2 ** 53 - 1
    # arg spells them out (a captured local costs every call): every long number there is one of them
    assert set(re.findall(r"\b\d{15,}\b", source("_lib_args"))) == {str(timeutil.MAX_MS), str(2 ** 53 - 1)}
    assert lua_constant("BATCH_LIMIT_MAX") == calls.CLAIM_MAX  # claim's max_jobs, tick's and reap's batch
    assert limits() == (64, codec.MAX_KEY_BYTES, calls.BATCH)  # 64: validate_name's (tested below)
    lease, grace = options.MAX_LEASE_S * 1000, options.MAX_GRACE_S * 1000
    assert f"lease > {lease}" in source("_lib_args") and f"MAX_LEASE_MS = {lease}" in source("extend")
    assert f"> {grace} then" in source("_lib_args")
    assert f"fire - nominal <= {cron.MAX_JITTER_S * 1000}" in source("_lib_args")
    assert f"'limit', 1, {listing.LIST_MAX_LIMIT})" in source("list")
    limit = inspect.signature(calls.error_arg).parameters["limit"].default
    assert f"ERROR_MAX = {4 * limit + 2}" in source("fail")  # UTF-8: at most 4 bytes a character, 2 NULs


NAMES = ["a", "q", "Z9", "emails.v2", "a-b_c.d", "x" * 64, "x" * 65, "", "-a", "_a", ".a", "a b", "a:b", "{a}", "é",
         "a\n", "nan", "1.5"]


def test_the_lua_name_rule_is_validate_name() -> None:
    lua = importlib.import_module("lupa.lua51").LuaRuntime(encoding=None)
    pattern = re.search(r"^local NAME_PATTERN = '(.+)'$", source("_lib_args"), re.M).group(1)
    check = lua.eval(f"function(s) return #s <= {limits()[0]} and string.find(s, '{pattern}') ~= nil end")
    for name in NAMES:
        try:
            validate_name("queue", name)
            python = True
        except ValueError:
            python = False
        assert check(name.encode()) is python, name


def test_a_refusal_reply_is_a_script_argument_error_naming_the_script_and_the_argument() -> None:
    reply = ResponseError('ZSCHED_ARG claim ARGV[7] receipt_ttl_ms: expected an integer from 1 to 86400000, got "nan"')
    err = script_error(reply)
    assert isinstance(err, ScriptArgumentError) and isinstance(err, ValueError)
    assert (err.script, err.argument, err.name) == ("claim", "ARGV[7]", "receipt_ttl_ms")
    assert str(err).startswith("claim refused ARGV[7] receipt_ttl_ms: expected an integer from 1 to 86400000, "
                               'got "nan"')
    assert "nothing was written" in str(err) and err.__cause__ is reply
    other = ResponseError("ERR something else")
    assert script_error(other) is other


@pytest.fixture
def client() -> Client:
    return Client(fakeredis.FakeRedis(), namespace="fk", partitions=2)


def test_on_fakeredis_a_bad_argument_is_refused_by_name_and_writes_nothing(client: Client) -> None:
    client.schedule(timedelta(seconds=60), "x", queue="q")
    before = {k: client.redis.dump(k) for k in client.redis.keys()}
    name, keys, args = raw_call(client.calls, "claim", 0, "q", 5, "rid-1", "nan", "", 5)  # a NaN receipt
    with pytest.raises(ScriptArgumentError, match=r"claim refused ARGV\[7\] receipt_ttl_ms") as err:
        client.transport.call(name, keys, args)
    assert err.value.argument == "ARGV[7]"
    name, keys, args = client.calls.prepare_one(timedelta(seconds=60), "y", None, options.JobOptions(queue="q"))
    args = list(args)
    args[8] = "nan"  # run_at
    with pytest.raises(ScriptArgumentError, match=r"ARGV\[9\] run_at"):
        client.transport.call(name, keys, args)
    assert {k: client.redis.dump(k) for k in client.redis.keys()} == before
