"""Child process of ``python -m bench transport`` (bench/transport_compare.py). Run as a script,
``python bench/transport_child.py MODE --root ROOT ...``, with ``PYTHONPATH=ROOT``: it imports
``scheduler`` from ROOT only (the old tree extracted from git, or the working tree), checks that it
did, and prints one JSON line. It imports nothing from ``bench`` (whose ``common`` module puts the
working tree first on sys.path), only the standard library, redis-py and ``scheduler``.

Modes: ``info`` (where the code and Lua came from, script SHAs), ``serve`` (W1: one-by-one
``schedule`` and ``schedule_many`` in slices the parent asks for), ``feed`` (schedule the W3 jobs
with this tree's client), ``profile-worker`` (``zsched worker`` under cProfile).
"""
from __future__ import annotations

import sys
from pathlib import Path

# run as a script, sys.path[0] is bench/ of the working tree: nothing may be imported from there
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from importlib import resources  # noqa: E402
from importlib.util import find_spec  # noqa: E402
from typing import Any  # noqa: E402


def _under(path: Any, root: Path) -> bool:
    try:
        Path(str(path)).resolve().relative_to(root)
        return True
    except ValueError:
        return False


def check_origin(root: Path) -> dict[str, Any]:
    """Import ``scheduler`` and fail unless it, its Lua scripts and ``workers`` come from ``root``
    (the venv's editable install of the working tree must not win)."""
    import importlib

    import scheduler

    # the old tree keeps the loader in scheduler/scripts.py; asking for the new name there would
    # import the working tree's module (the editable install maps scheduler.protocol to it)
    loader = "scheduler.protocol.scripts" if (root / "scheduler" / "protocol").is_dir() else "scheduler.scripts"
    scripts = importlib.import_module(loader)
    lua = resources.files("scheduler.lua")
    spec = find_spec("workers")
    where = {"scheduler": scheduler.__file__, "scheduler.lua": str(lua), loader: scripts.__file__,
             "workers": spec.origin if spec else None}
    bad = {k: v for k, v in where.items() if v is None or not _under(v, root)}
    if bad:
        raise SystemExit(f"transport_child: imported from the wrong tree (expected under {root}): {bad}")
    shas = {name: s.sha for name, s in scripts.load_scripts().items()}
    return {"root": str(root), "imported_from": where, "shas": shas}


def connected(client_cls: Any, url: str, **kwargs: Any) -> Any:
    """A client of either tree with its first round trip (reading the partition count) done, so
    no timed call pays it: the working tree's client connects lazily (``connect()``), the old
    tree's in its constructor."""
    c = client_cls.from_url(url, **kwargs)
    if hasattr(c, "connect"):
        c.connect()
    return c


def mode_info(args: argparse.Namespace, origin: dict[str, Any]) -> dict[str, Any]:
    import redis
    try:
        import hiredis
        hv = hiredis.__version__
    except ImportError:
        hv = None
    return {**origin, "redis_py": redis.__version__, "hiredis": hv, "pid": os.getpid()}


def mode_serve(args: argparse.Namespace, origin: dict[str, Any]) -> dict[str, Any]:
    """W1 on commands from the parent, one JSON line each way, so that two children (old and new)
    can take turns in short slices: ``{"cmd": "reset", "ns": NS}`` (a new Client on a fresh
    namespace), ``{"cmd": "one", "n": K}`` (K ``schedule`` calls one by one, timed; with
    ``"profile": PATH`` under cProfile), ``{"cmd": "many", "n": K}`` (one ``schedule_many`` of K),
    ``{"cmd": "quit"}``. Starts with a warm-up (loads the script, warms the code paths)."""
    from scheduler import Client

    payload = json.loads(args.payload)
    c = connected(Client, args.url, namespace="warmup")
    at = time.time() + 3600
    for _ in range(args.warmup):
        c.schedule(at, payload)
    _reply({"ready": True, **origin})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["cmd"]
        if op == "quit":
            break
        if op == "reset":
            c.close()
            c = connected(Client, args.url, namespace=cmd["ns"])
            at = time.time() + 3600
            _reply({"ok": True})
        elif op == "one":
            n = cmd["n"]
            prof = None
            if cmd.get("profile"):
                import cProfile
                prof = cProfile.Profile()
                prof.enable()
            cpu, t = time.process_time(), time.perf_counter()
            for _ in range(n):
                c.schedule(at, payload)
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
            if prof is not None:
                prof.disable()
                prof.dump_stats(cmd["profile"])
            _reply({"n": n, "wall": wall, "cpu": cpu})
        elif op == "many":
            n = cmd["n"]
            jobs = [(at, payload)] * n
            t = time.perf_counter()
            ids = c.schedule_many(jobs)
            wall = time.perf_counter() - t
            assert len(set(ids)) == n
            _reply({"n": n, "wall": wall})
        else:
            raise SystemExit(f"transport_child: unknown command {op!r}")
    c.close()
    return {"bye": True}


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def mode_feed(args: argparse.Namespace, origin: dict[str, Any]) -> dict[str, Any]:
    """Schedule ``jobs`` jobs due at ``t0`` in queue ``bench`` (chunks of 5000, as w3_drain does)
    with this tree's client; write their ids to ``ids_file``."""
    from scheduler import Client

    payload = json.loads(args.payload)
    c = connected(Client, args.url, namespace=args.namespace, partitions=args.partitions)
    t = time.perf_counter()
    ids: list[str] = []
    for s in range(0, args.jobs, 5000):
        ids += c.schedule_many([(args.t0, payload)] * min(5000, args.jobs - s), queue="bench")
    took = time.perf_counter() - t
    c.close()
    Path(args.ids_file).write_text("\n".join(ids))
    return {"scheduled": len(ids), "seconds": took, "finished_before_t0_s": args.t0 - time.time()}


def profile_worker(argv: list[str]) -> int:
    """``profile-worker --root ROOT --out FILE -- zsched-args...``: ``zsched worker`` of this tree
    in this process, under cProfile (process CPU time) from after the imports to the worker's exit
    (SIGTERM)."""
    import cProfile
    import importlib

    root, out, rest = Path(argv[argv.index("--root") + 1]).resolve(), argv[argv.index("--out") + 1], \
        argv[argv.index("--") + 1:]
    check_origin(root)
    import scheduler.shell.cli  # noqa: F401  (imports outside the profile)
    import workers.cli  # noqa: F401
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as ``zsched worker`` does for MODULE:ATTR
    importlib.import_module(rest[1].split(":")[0])
    # CPU time, not wall time: a wall-clock profile of a worker on a loaded 2-core machine charges
    # the time it waits or is preempted (epoll, send waking Redis) to whatever call it was in
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    try:
        code = scheduler.shell.cli.main(rest)
    finally:
        prof.disable()
        prof.dump_stats(out)
    return code


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "profile-worker":
        sys.exit(profile_worker(sys.argv[2:]))
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("info", "serve", "feed"))
    p.add_argument("--root", required=True)
    p.add_argument("--url")
    p.add_argument("--payload", default="null")
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--namespace", default="bench")
    p.add_argument("--partitions", type=int, default=16)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--t0", type=float, default=0.0)
    p.add_argument("--ids-file")
    args = p.parse_args()
    origin = check_origin(Path(args.root).resolve())
    out = {"info": mode_info, "serve": mode_serve, "feed": mode_feed}[args.mode](args, origin)
    out["origin_ok"] = True
    print(json.dumps(out, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
