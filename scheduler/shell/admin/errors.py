"""What an operator operation reports when it cannot be done, with the CLI's exit code."""
from __future__ import annotations

from ...protocol.errors import ZschedError
from ...protocol.models import JobState


class AdminError(ZschedError):
    """An operation could not be done; ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class NotFound(AdminError):
    """No such job (or namespace). Exit code 1."""


class WrongState(AdminError):
    """The job exists but its state does not allow the operation. Exit code 1."""

    def __init__(self, message: str, state: JobState) -> None:
        super().__init__(message)
        self.state = state


class BadInput(AdminError, ValueError):
    """An argument is invalid; the message says what was wrong and what is expected. Exit code 2."""

    exit_code = 2


class Refused(AdminError):
    """Redis refused what the operation needs to this user (an ACL without the keys); the message
    names the keys. Exit code 3, as for any refusal by Redis."""

    exit_code = 3
