"""Names zsched writes into SQL statements of the user's PostgreSQL (the fenced effects' table,
the outbox's), checked once here: they are formatted into statements, so never taken unchecked."""
from __future__ import annotations

import re

# "name" or "schema.name", each an unquoted PostgreSQL identifier (lower case: unquoted names fold
# to it, so the DDL and the statements name the same table whatever the user typed)
_TABLE = re.compile(r"^[a-z_][a-z0-9_$]{0,62}(\.[a-z_][a-z0-9_$]{0,62})?$")


def check_table(table: object, what: str, error: type[Exception] = ValueError) -> str:
    """``table`` if it is ``name`` or ``schema.name`` of unquoted lower-case identifiers; else
    ``error`` (a ValueError by default) naming ``what`` (e.g. "outbox table")."""
    if not isinstance(table, str) or not _TABLE.match(table):
        raise error(f"{what} name {table!r} is not 'name' or 'schema.name' of lower-case letters, "
                    "digits, '_' and '$' (63 at most each, not starting with a digit)")
    return table
