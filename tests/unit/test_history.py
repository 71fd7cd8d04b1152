"""The last hour's per-minute counts, pure parts: summing the partitions' minute hashes
(scheduler/protocol/history.py), the chart's scale and geometry (scheduler/shell/ui/history.py),
and the TTL the scripts set, written once on each side of the wire."""
from __future__ import annotations

import re
from pathlib import Path

from scheduler.protocol import history
from scheduler.protocol.history import KINDS, MINUTES, QueueHistory, merge
from scheduler.shell.ui.history import GEOMETRY, chart, nice_top

ROOT = Path(__file__).resolve().parents[2]


def test_merge_sums_partitions_per_queue_and_minute_and_ignores_what_is_not_a_count_of_the_window() -> None:
    first = 1000
    hashes = [
        (1000, {b"fired:mail": b"3", b"acked:mail": b"2"}),     # partition 0
        (1000, {b"fired:mail": b"4", b"dead:sms": b"1"}),       # partition 1, same minute
        (1059, {"failed:mail": "5"}),                           # the window's last minute
        (999, {b"fired:mail": b"100"}),                         # before the window
        (1060, {b"fired:mail": b"100"}),                        # after it
        (1001, {b"scheduled:mail": b"9", b"fired:": b"1"}),     # not a charted kind; no queue
    ]
    out = merge(first, MINUTES, hashes)
    assert set(out) == {"mail", "sms"}
    mail = out["mail"]
    assert (mail.series["fired"][0], mail.series["acked"][0], mail.series["failed"][59]) == (7, 2, 5)
    assert mail.total("fired") == 7 and mail.total("dead") == 0 and mail.peak() == 7
    assert out["sms"].total("dead") == 1 and all(len(s) == MINUTES for s in mail.series.values())


def test_the_y_scale_tops_at_1_2_or_5_times_a_power_of_ten() -> None:
    assert [nice_top(n) for n in (0, 1, 2, 3, 7, 10, 11, 21, 99, 101, 4999, 5001)] == \
        [1, 1, 2, 5, 10, 10, 20, 50, 100, 200, 5000, 10000]


def test_a_chart_has_one_point_per_minute_per_kind_inside_its_frame_and_a_hover_text_per_minute() -> None:
    series = {k: [0] * MINUTES for k in KINDS}
    series["acked"][-1] = 8
    c = chart(QueueHistory("mail", 29_000_000, series))
    assert c.top == 10 and c.totals == {"fired": 0, "acked": 8, "failed": 0, "dead": 0}
    for kind, points in c.lines.items():
        xy = [tuple(map(float, p.split(","))) for p in points.split()]
        assert len(xy) == MINUTES, kind
        assert all(GEOMETRY["left"] <= x <= GEOMETRY["right"] and GEOMETRY["top"] <= y <= GEOMETRY["base"]
                   for x, y in xy), kind
    acked = [float(p.split(",")[1]) for p in c.lines["acked"].split()]
    assert acked[-1] < acked[0], "a higher count is drawn higher up"
    assert len(c.columns) == MINUTES and c.columns[-1][1].endswith("fired 0, acked 8, failed 0, dead 0")
    assert re.fullmatch(r"\d\d:\d\d UTC: .*", c.columns[0][1])


def test_the_scripts_and_the_reader_agree_on_the_minute_hashes_ttl() -> None:
    lua = (ROOT / "lua" / "_lib.lua").read_text("utf-8")
    m = re.search(r"^local HISTORY_TTL_S = (\d+)", lua, re.M)
    assert m and int(m.group(1)) == history.TTL_S
    assert history.TTL_S >= MINUTES * 60, "a minute the chart shows must not have expired"
