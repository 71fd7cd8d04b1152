"""Where the overview's numbers lead: every count is a link to the list of those jobs, and a
queue's name opens the list that has jobs (not an empty ready list for a queue whose jobs are all
scheduled). Registered as template globals (``count_link``, ``queue_link``), with the one-line
error summary of listings (filter ``errline``)."""
from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from .. import admin

QUEUE_ORDER = ("ready", "held", "scheduled", "running", "dead")  # what a queue's name opens: the first with jobs
LIST_OF = {"scheduled": "scheduled", "held": "scheduled", "ready": "ready", "running": "running"}
"""The job list each overview count is on: held jobs (due, waiting on the queue's rate limit) head
the scheduled list."""


def count_link(queue: str, state: str) -> str:
    """The list behind the count of ``queue``'s jobs in ``state`` (dead jobs: the dead letters)."""
    if state == "dead":
        return "/dead?" + urlencode({"queue": queue})
    return "/jobs?" + urlencode({"queue": queue, "state": LIST_OF[state]})


def queue_link(row: Any) -> str:
    """A queue row's (``name``, ``counts``) link: the list of the first state in QUEUE_ORDER that
    has jobs, the ready list when none has."""
    state = next((s for s in QUEUE_ORDER if row.counts.get(s, 0)), "ready")
    return count_link(row.name, state)


GLOBALS = {"count_link": count_link, "queue_link": queue_link, "count_scan": admin.COUNT_SCAN}
FILTERS = {"errline": admin.error_line}  # a last error as one line in a listing
