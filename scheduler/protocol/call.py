"""A script call as data: ``(script name, keys, args)``, built by the typed builders of this
package (:mod:`.calls`, :mod:`.tick`, :mod:`.transitions`, :mod:`.control`, :mod:`.listing`,
:mod:`.registry`) and sent by the transports of :mod:`scheduler.redisio`."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Call = tuple[str, Sequence[Any], Sequence[Any]]
