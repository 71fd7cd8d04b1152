"""The rules a script batch follows in flight (scheduler/redisio/batch.py): which error replies
mean "not run", how redirects and NOSCRIPT keep a call pending, how replies of several cluster
nodes to the command sent after a batch (WAIT) become one."""
from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from redis._parsers.base import BaseParser
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError

from scheduler.protocol.calls import ONE_KEY_OFF_CLUSTER, Calls
from scheduler.protocol.keys import PARTITION_KEYS, Keyspace
from scheduler.protocol.options import JobOptions
from scheduler.protocol.scripts import (
    LIBRARY_MARKER,
    SCRIPT_NAMES,
    assemble,
    check_uses,
    declared_uses,
    library_definitions,
    library_source,
    load_scripts,
    make_script,
    names_used,
    restate_uses,
    script_source,
    strip_comments,
)
from scheduler.protocol.tick import Retention, tick_call
from scheduler.protocol.transitions import ack_call, claim_call, fail_call
from scheduler.redisio.batch import NO_TAIL, RESEND, RESEND_FLAG, Batch, any_ran, merge_tails, not_run
from scheduler.redisio.routing import slot_of


class _Parser(BaseParser):
    """redis-py's own error-reply parsing, without a connection."""

    def on_connect(self, connection: Any) -> None: ...

    def on_disconnect(self) -> None: ...


@pytest.mark.parametrize("reply", ["READONLY You can't write against a read only replica.",
                                   "LOADING Redis is loading the dataset in memory",
                                   "TRYAGAIN Multiple keys request during rehashing of slot",
                                   "CLUSTERDOWN The cluster is down",
                                   "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
                                   "BUSY Redis is busy running a script.",
                                   "NOREPLICAS Not enough good replicas to write."])
def test_refusals_that_did_not_run_are_recognised_as_redis_py_parses_them(reply: str) -> None:
    # redis-py turns several of these into their own exception classes and strips the code
    # from the message: matching on the text alone missed READONLY after a failover
    exc = _Parser().parse_error(reply)
    assert not_run(exc), (type(exc).__name__, str(exc))


@pytest.mark.parametrize("reply", ["ERR wrong number of arguments", "WRONGTYPE Operation against a key",
                                   "OOM command not allowed when used memory > 'maxmemory'."])
def test_other_errors_are_final(reply: str) -> None:
    assert not not_run(_Parser().parse_error(reply))


def _batch(n: int) -> Batch:
    keys = ["{ns:%d}:t" % i for i in range(n)]
    return Batch([("stats", [k], []) for k in keys], load_scripts())


def test_replies_settle_calls_and_redirects_keep_them_pending() -> None:
    b = _batch(5)
    moved = MovedError(f"{slot_of('{ns:1}:t')} 127.0.0.1:7001")
    ask = AskError(f"{slot_of('{ns:2}:t')} 127.0.0.1:7002")
    missing, wait = b.take([0, 1, 2, 3, 4], ["ok", moved, ask, NoScriptError("No matching script"),
                                             ResponseError("TRYAGAIN Multiple keys")])
    assert missing == ["stats"] and wait
    assert b.results[0] == "ok" and b.pending == [1, 2, 3, 4]
    assert b.moved == [moved] and set(b.ask) == {2}
    # the ASK-redirected call is sent once with ASKING in front of it
    cmds = b.commands([2, 3])
    assert cmds[0] == ("ASKING",) and cmds[1][0] == "EVALSHA" and cmds[2][0] == "EVALSHA"
    b.take([2, 3, 4, 1], ["two", "three", "four", "one"])
    assert b.pending == [] and b.results == ["ok", "one", "two", "three", "four"] and not b.ask


def test_a_lost_reply_marks_only_the_calls_of_that_node_as_resent() -> None:
    b = Batch([("schedule", ["{ns:0}:t"], [0, 0, 0, 0, 0, 0, 0]), ("schedule", ["{ns:1}:t"], [0, 0, 0, 0, 0, 0, 0])],
              load_scripts())
    b.mark_resent([1])
    assert list(b.calls[0][2])[6] == 0 and list(b.calls[1][2])[6] == 1, "the re-send flag on the lost call only"


def test_the_weakest_node_reply_answers_for_the_batch() -> None:
    assert merge_tails([]) is None
    assert merge_tails([2]) == 2
    assert merge_tails([2, 1, 3]) == 1, "WAIT: fewest replicas any node reached"
    assert merge_tails([[1, 2], [1, 0]]) == [1, 0], "WAITAOF: element by element"
    err = ResponseError("NOREPLICAS")
    assert merge_tails([2, err]) is err


def test_partition_keys_share_one_slot() -> None:
    assert slot_of("{ns:3}:t") == slot_of("{ns:3}:r:mail") == slot_of(b"{ns:3}:j")
    assert slot_of("{ns:3}:t") != slot_of("{ns:4}:t")


def test_a_round_trip_in_which_no_call_ran_does_not_answer_for_the_batch() -> None:
    # a schedule sent to a node that lost the slot (MOVED), then WAIT there: "WAIT cannot be used
    # with replica instances" must not fail the batch once the re-sent call ran and its WAIT answered
    moved = MovedError("3999 127.0.0.1:6381")
    assert not any_ran([moved, AskError("3999 127.0.0.1:6381"), ResponseError("TRYAGAIN Multiple keys"),
                        NoScriptError("No matching script")])
    assert any_ran([moved, ["id"]]) and any_ran([ResponseError("ERR user_script:1: boom")])
    assert merge_tails([NO_TAIL, 1]) == 1
    assert merge_tails([NO_TAIL]) is None


def test_a_script_carries_only_the_helpers_its_code_uses_not_those_named_in_comments() -> None:
    lib = "\n".join([
        "-- used_helper: mentions unused_helper in a comment only",
        "local function used_helper() return 'x -- not a comment' .. other() end",
        "local function other() return 1 end  -- unused_helper again",
        "local function unused_helper() return 2 end",
        "local BIG = {'a', 'b'}",
    ])
    script = assemble(lib, "-- calls unused_helper? no:\nreturn used_helper()")
    assert "local function used_helper" in script and "local function other" in script
    assert "local function unused_helper" not in script and "BIG" not in script
    # every shipped script is assembled this way: schedule no longer carries queue retirement
    assert "local function retire_queues" not in load_scripts()["schedule"].source


def test_a_library_marker_puts_the_helpers_after_a_fast_path_except_those_the_fast_path_uses() -> None:
    lib = "\n".join(["local function base() return 0 end", "local function early() return base() end",
                     "local function helper() return 1 end", "local function unused() return 2 end"])
    script = assemble(lib, f"if ARGV[1] == 'x' then return early() end\n{LIBRARY_MARKER}\nreturn helper()")
    assert (script.index("local function base") < script.index("local function early") < script.index("if ARGV[1]")
            < script.index("local function helper") < script.index("return helper()"))
    assert "unused" not in script and LIBRARY_MARKER not in script and script.count("local function early") == 1
    with pytest.raises(ValueError, match="one --@library line"):
        assemble(lib, f"{LIBRARY_MARKER}\n{LIBRARY_MARKER}\nreturn 1")
    # schedule's one-job fast path runs before Redis builds the helper closures it does not use
    src = load_scripts()["schedule"].source
    assert src.startswith("local SCRIPT = 'schedule'\n")
    fast = src.index("if A[6] == '1'")
    assert src.index("local function record_problem") < fast < src.index("local function queue_index")


def test_the_keys_a_script_does_not_declare_are_named_as_the_keyspace_names_them() -> None:
    lib = library_source()
    named = dict(re.findall(r"KEYS\[(\d+)\] or PREFIX \.\. '(\w+)'", lib))
    expected = {str(i + 1): name for i, name in enumerate(PARTITION_KEYS) if i > 0}
    assert named == expected
    for name in ONE_KEY_OFF_CLUSTER:  # the fast paths name theirs from their own local 'prefix'
        fast = re.findall(r"KEYS\[(\d+)\] or prefix \.\. '(\w+)'", script_source(name))
        assert all(expected[i] == key for i, key in fast), (name, fast)
    assert {"schedule", "tick", "claim", "ack"} <= ONE_KEY_OFF_CLUSTER
    ks = Keyspace("ns", 4)
    for declare_all in (False, True):  # True on a Redis Cluster: a migrating slot is judged by declared keys
        calls = Calls(ks, max_payload_bytes=1024, tombstone_ttl=60, declare_all_keys=declare_all)
        call = calls.prepare_one(timedelta(0), None, None, JobOptions())
        keys = ks.partition_keys(int(call[2][2].split("/")[0]))
        assert call[0] == "schedule" and list(call[1]) == (keys if declare_all else keys[:1])
        one = ks.partition_keys(1) if declare_all else ks.partition_keys(1)[:1]
        assert list(claim_call(calls, 1, "q", 1)[1]) == one
        assert list(ack_call(calls, 1, [(b"x" * 15, 1)])[1]) == one
        assert list(tick_call(calls, 1, 0, 100, {}, Retention(), 0)[1]) == one
        assert list(fail_call(calls, 1, [])[1]) == ks.partition_keys(1)  # the rest declare every key


def test_scripts_reach_redis_without_their_comments_but_with_every_string_intact() -> None:
    src = "\n".join([
        "-- a header comment",
        "",
        "local s = 'a -- b' .. \"c -- d\"  -- trailing",
        "local e = 'it\\'s -- kept'",
        "   -- indented comment",
        "return s",
    ])
    assert strip_comments(src) == "local s = 'a -- b' .. \"c -- d\"\nlocal e = 'it\\'s -- kept'\nreturn s\n"
    for script in load_scripts().values():
        assert "\n--" not in script.source and not script.source.startswith("--"), script.name


# -- explicit linking -----------------------------------------------------------------------------


LINK_LIB = "\n".join(["local K_X = 'x'", "local function base() return K_X end",
                      "local function helper() return base() end", "local function spare() return 2 end"])


def test_a_script_gets_the_library_names_its_uses_line_lists_with_what_those_use() -> None:
    body = "-- demo\n-- Uses: helper\nreturn helper()"
    assert declared_uses(body) == {"helper"}
    script = make_script("demo", LINK_LIB, body).source
    assert "local function helper" in script and "local function base" in script and "K_X" in script
    assert "spare" not in script and "Uses" not in script  # comments are stripped before loading


def test_a_uses_line_wraps_onto_indented_comment_lines() -> None:
    body = "-- Uses: a, b,\n--       c, d\n--   e\n-- Returns: x, y\nreturn 1"
    assert declared_uses(body) == {"a", "b", "c", "d", "e"}
    assert declared_uses("return 1") is None


@pytest.mark.parametrize("body, match", [
    ("return helper()", "has no '-- Uses:' line"),
    ("-- Uses: base\nreturn helper() .. base()", r"used but not listed \['helper'\], listed but not used \[\]"),
    ("-- Uses: helper, spare\nreturn helper()", r"used but not listed \[\], listed but not used \['spare'\]"),
    ("-- Uses: helper, nowhere\nreturn helper()", r"listed but not used \['nowhere'\]"),
])
def test_a_script_whose_uses_line_does_not_match_its_code_fails_to_load_naming_the_difference(
        body: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as e:
        make_script("demo", LINK_LIB, body)
    assert "lua/demo.lua" in str(e.value)


def test_every_shipped_script_lists_exactly_the_library_names_it_uses() -> None:
    lib = library_source()
    for name in SCRIPT_NAMES:
        assert check_uses(name, lib, script_source(name)), name


# What a call names once for all its helpers (lua/_lib.lua's header): the partition's keys, the
# prefix, channel prefix, partition number and layout, and the call's own KEYS and ARGV.
CALL_CONTEXT = {"K_T", "K_M", "K_J", "K_I", "K_L", "K_D", "K_E", "K_K", "K_X", "K_Q", "K_G", "K_C", "K_META", "K_F",
                "PREFIX", "CHAN", "PART", "LAYOUT", "KEYS", "ARGV"}


def ambient_reads(lib: str) -> dict[str, tuple[set[str], str]]:
    """Per helper function of ``lib``: the call-context names its code reads, and what its
    "Ambient:" comment (above its definition, to the definition) says, '' without one."""
    out: dict[str, tuple[set[str], str]] = {}
    for names, text in library_definitions(lib):
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if not line.startswith("--") and line.strip())
        if not lines[at].startswith("local function "):
            continue
        comment = "\n".join(lines[:at])
        note = comment[comment.index("Ambient:"):] if "Ambient:" in comment else ""
        out[", ".join(sorted(names))] = (names_used("\n".join(lines[at:])) & CALL_CONTEXT, note)
    return out


def test_a_library_helper_takes_the_call_context_it_reads_as_parameters_or_names_it_in_an_ambient_note() -> None:
    helpers = ambient_reads(library_source())
    assert {"jget", "ring", "tombstone", "cancel_job", "arg"} <= set(helpers)
    bad = []
    for name, (read, note) in helpers.items():
        said = set(re.findall(r"\w+", note))
        if not read <= said:
            bad.append(f"{name} reads {sorted(read)}, its 'Ambient:' note names {sorted(read & said)}")
    assert not bad, "helpers reading the call's context without saying so:\n" + "\n".join(bad)
    # the explicit ones really are: jget's key, ring's channel and prefix are its parameters
    assert helpers["jget"] == (set(), "") and helpers["ring"] == (set(), "")


def test_the_ambient_check_sees_a_helper_that_reads_a_key_silently() -> None:
    lib = "\n".join(["local K_J, K_T = KEYS[3], KEYS[1]", "-- reads the body", "local function silent(id)",
                     "  return redis.call('HGET', K_J, id) -- not K_T", "end",
                     "-- Ambient: K_T, the timers", "local function said() return redis.call('ZCARD', K_T) end",
                     "local function explicit(k_j, id) return redis.call('HGET', k_j, id) end"])
    assert ambient_reads(lib) == {"silent": ({"K_J"}, ""), "said": ({"K_T"}, "Ambient: K_T, the timers"),
                                  "explicit": (set(), "")}


def test_the_resend_flags_come_from_the_script_headers_and_match_the_resend_table() -> None:
    assert RESEND_FLAG == {"schedule": 6, "migrate_in": 4}
    assert set(RESEND_FLAG) == {name for name, how in RESEND.items() if how == "flag"}
    for name, i in RESEND_FLAG.items():  # the ARGV description in the header names the flag there
        header = script_source(name).split("\n-- Uses:")[0]
        assert re.search(rf"\b{i + 1} [a-z-]*(?:re-send|check) flag", header), (name, i)


def test_a_variant_of_a_script_gets_its_uses_line_restated_from_its_code() -> None:
    body = "-- Uses: helper, spare\n--       base\nreturn helper()"
    with pytest.raises(ValueError, match="listed but not used"):
        make_script("demo", LINK_LIB, body)
    restated = restate_uses(LINK_LIB, body)
    assert declared_uses(restated) == {"helper"} and "spare" not in restated
    assert "local function helper" in make_script("demo", LINK_LIB, restated).source


def test_an_error_of_a_connection_closed_under_a_round_trip_counts_as_a_lost_connection() -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from scheduler.redisio.transport_async import closed_under_us

    class Conn:
        def __init__(self, connected: bool) -> None:
            self.is_connected = connected

    missing = AttributeError("'NoneType' object has no attribute 'writelines'")
    lost = closed_under_us(Conn(False), missing)
    assert isinstance(lost, RedisConnectionError) and "closed while in use" in str(lost)
    assert closed_under_us(Conn(True), missing) is None, "a live connection's AttributeError is a bug: raised"
    timeout = TimeoutError("read")
    assert closed_under_us(Conn(True), timeout) is timeout
    # uvloop's word for a write to a stream the cluster client closed under us
    closed = RuntimeError("unable to perform operation on <TCPTransport closed=True reading=False 0x5>; "
                          "the handler is closed")
    assert isinstance(closed_under_us(Conn(True), closed), RedisConnectionError)
    assert isinstance(closed_under_us(Conn(False), RuntimeError("boom")), RedisConnectionError)
    assert closed_under_us(Conn(True), RuntimeError("boom")) is None, "any other RuntimeError is a bug: raised"
