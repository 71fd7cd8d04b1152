"""``zsched dev``'s demo producer: a thread scheduling a realistic mix into the dev stack, which
rides out a Redis that stops answering (stalled, restarting) instead of dying with a traceback."""
from __future__ import annotations

import random
import threading
import time

from ..client import Client
from ..protocol.masking import mask_secrets
from ..redisio.errors import REDIS_ERRORS

RETRY_MAX_S = 5.0  # the longest pause between two tries while Redis does not answer


class Producer(threading.Thread):
    """A realistic mix: one-off jobs seconds to minutes ahead, a job that always fails and ends
    dead, and now and then a herd of reports due in the same second (rate-limited). While Redis
    does not answer it pauses (0.2 s, doubling up to :data:`RETRY_MAX_S`) and tries again;
    ``trouble`` says why meanwhile (None while it schedules)."""

    def __init__(self, url: str, ns: str) -> None:
        super().__init__(daemon=True, name="demo-producer")
        self.url, self.ns = url, ns
        self.stop_event = threading.Event()
        self.trouble: str | None = None

    def run(self) -> None:
        client: Client | None = None
        rnd = random.Random()
        next_herd = time.time() + 10
        pause = 0.2
        while not self.stop_event.wait(pause):
            try:
                if client is None:
                    client = self._primed()
                next_herd = self._batch(client, rnd, next_herd)
                self.trouble, pause = None, 0.2
            except REDIS_ERRORS as exc:  # stalled or restarting: the stack's processes ride it out too
                self.trouble = mask_secrets(f"{type(exc).__name__}: {exc}")
                pause = min(RETRY_MAX_S, pause * 2)
        if client is not None:
            client.close()

    def _primed(self) -> Client:
        """A client of the stack with the demo's set-up done (the reports' rate limit, the job that
        fails); a failure part-way closes it and raises, so the next try starts over."""
        client = Client.from_url(self.url, namespace=self.ns)
        try:
            client.set_rate_limit("reports", 200)
            client.schedule(time.time() + 2, {"partner": "acme"}, queue="flaky", max_attempts=3, backoff=(0.5, 4))
        except BaseException:
            client.close()
            raise
        return client

    @staticmethod
    def _batch(c: Client, rnd: random.Random, next_herd: float) -> float:
        """One round of the mix; returns when the next herd is due."""
        now = time.time()
        c.schedule_many([(now + rnd.choice((1, 2, 5, 10, 30, 60, 120)) * rnd.random(),
                          {"to": f"user{rnd.randint(1, 10**6)}@example.com", "template": "welcome"})
                         for _ in range(rnd.randint(5, 40))], queue="emails")
        if now < next_herd:
            return next_herd
        c.schedule_many([(now + 5, {"report": i}) for i in range(1000)], queue="reports")
        if rnd.random() < 0.5:
            c.schedule(now + 3, {"partner": "globex"}, queue="flaky", max_attempts=3, backoff=(0.5, 4))
        return now + 45
