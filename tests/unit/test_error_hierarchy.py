"""Every exception zsched raises is a :class:`~scheduler.ZschedError`, so a caller can catch all of
them in one clause, while each keeps the standard base it was given (``ValueError`` for bad input,
``ConnectionError`` for an unreachable server, ``RuntimeError``, ``OSError``) for callers that
catch by kind. Outside it: the two a *handler* raises to steer its job, and the CLI's Ctrl-C."""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import scheduler
import workers
from scheduler import ZschedError

# raised by user code, not by zsched: a handler's way to say what happens to its job
STEERING = {"workers.errors.Retry", "workers.errors.PermanentError"}
# a signal, not an error: a KeyboardInterrupt, which ``except Exception`` must not catch
SIGNALS = {"scheduler.shell.cli_errors.Interrupted"}


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of scheduler/ and workers/ (files, not
    ``pkgutil``: ``scheduler.shell`` is a namespace package, which it does not descend into)."""
    found: dict[str, type[BaseException]] = {}
    for pkg in (scheduler, workers):
        root = Path(pkg.__file__ or "").parent
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            if parts[-1] == "__main__":  # runs the CLI
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            module = importlib.import_module(name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


EXCEPTIONS = exception_classes()


def test_the_walk_finds_the_exceptions_of_every_layer() -> None:
    for name in ("scheduler.coord.api.CoordinationError", "scheduler.shell.admin.errors.AdminError",
                 "scheduler.shell.servers.process.ServerError", "scheduler.redisio.batch.NodeFailed",
                 "scheduler.redisio.pubsub.SubscriptionLost", *STEERING):
        assert name in EXCEPTIONS


@pytest.mark.parametrize("name", sorted(set(EXCEPTIONS) - STEERING - SIGNALS))
def test_every_exception_zsched_raises_is_a_zsched_error(name: str) -> None:
    assert issubclass(EXCEPTIONS[name], ZschedError), f"{name} derives from {EXCEPTIONS[name].__mro__[1:]}"


@pytest.mark.parametrize("name", sorted(STEERING))
def test_the_handlers_steering_exceptions_stay_outside_it(name: str) -> None:
    """``except ZschedError`` around a client call inside a handler must not swallow the handler's
    own Retry or PermanentError."""
    assert not issubclass(EXCEPTIONS[name], ZschedError)


def test_each_keeps_its_standard_base_for_callers_that_catch_by_kind() -> None:
    import redis

    from scheduler.redisio.batch import NodeFailed
    from scheduler.redisio.pubsub import SubscriptionLost
    from scheduler.shell.admin.errors import BadInput
    from scheduler.shell.servers.process import ServerError
    assert issubclass(NodeFailed, redis.ConnectionError) and issubclass(SubscriptionLost, redis.ConnectionError)
    assert issubclass(BadInput, ValueError) and issubclass(ServerError, RuntimeError)


def test_retry_policy_is_now_redis_retry_and_the_old_name_warns() -> None:
    assert "RedisRetry" in scheduler.__all__ and "RetryPolicy" not in scheduler.__all__
    with pytest.warns(DeprecationWarning, match="RetryPolicy is now scheduler.RedisRetry"):
        old = scheduler.RetryPolicy  # type: ignore[attr-defined]
    assert old is scheduler.RedisRetry
    with pytest.raises(AttributeError):
        scheduler.NoSuchName  # type: ignore[attr-defined]  # noqa: B018
