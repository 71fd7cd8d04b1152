"""Process-level tuning shared by the long-running processes (scheduler replicas, workers)."""
from __future__ import annotations

import gc


def settle_gc() -> None:
    """Call once start-up is done: move everything allocated so far (modules, clients, scripts)
    out of the collector's reach and make young-generation collections rarer. A full collection
    over start-up objects is a multi-millisecond pause that lands on a firing or a handler start;
    the hot paths free their objects by reference counting, so little is left for the collector."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, 5000), gen1, gen2)
