"""A long-running command's stop signal that comes while its event loop is being set up (before
its handlers exist) is handed to those handlers once they are installed, not raised inside the
loop's set-up (uvloop's C code), where it became a traceback instead of an orderly stop."""
from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Iterator
from types import FrameType

import pytest

from scheduler import runtime
from scheduler.shell.cli_errors import Interrupted


@pytest.fixture
def raising_sigterm() -> Iterator[None]:
    """SIGTERM raises, as ``zsched`` sets it for one-shot commands before a command runs."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    yield
    signal.signal(signal.SIGTERM, previous)


def signalling_loop_factory(sig: signal.Signals) -> Callable[[], asyncio.AbstractEventLoop]:
    def make() -> asyncio.AbstractEventLoop:
        os.kill(os.getpid(), sig)  # arrives while the loop is being made
        return asyncio.new_event_loop()
    return make


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_during_loop_set_up_reaches_the_handlers_installed_later(
        raising_sigterm: None, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals) -> None:
    monkeypatch.setattr(runtime, "loop_factory", lambda: signalling_loop_factory(sig))
    got: list[signal.Signals] = []

    async def main() -> str:
        stopped = asyncio.Event()

        def handler(s: signal.Signals) -> None:
            got.append(s)
            stopped.set()

        runtime.stop_signals(asyncio.get_running_loop(), handler)
        async with asyncio.timeout(5):
            await stopped.wait()
        return "stopped in order"

    assert runtime.run(main()) == "stopped in order"
    assert got == [sig]


def test_the_previous_handlers_are_back_after_the_loop(raising_sigterm: None) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    async def main() -> None:
        runtime.stop_signals(asyncio.get_running_loop(), lambda s: None)

    runtime.run(main())
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    with pytest.raises(Interrupted):
        os.kill(os.getpid(), signal.SIGTERM)
        signal.sigtimedwait([], 0)  # a bytecode boundary for the handler to run at
