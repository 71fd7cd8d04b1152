"""``zsched effects ddl | apply | prune`` against a real PostgreSQL (and Redis for the namespace's
tombstone TTL): what each prints and does, and one error line with its exit code for each mistake."""
from __future__ import annotations

import subprocess
import sys

import psycopg

from scheduler import Client
from workers import Job
from workers.effects import ddl, fenced

ZSCHED = [sys.executable, "-m", "scheduler"]


def zsched(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ZSCHED, "effects", *argv], capture_output=True, text=True, timeout=60, env=env)


def _job(n: int, namespace: str) -> Job:
    return Job(n.to_bytes(15, "big"), "q", None, None, 1, 5, 1_700_000_000_000, 100 + n, 30.0, namespace=namespace)


def test_ddl_prints_what_apply_runs_and_apply_is_idempotent(pg_dsn: str) -> None:
    out = zsched("ddl", "--table", "app.effects")
    assert out.returncode == 0 and out.stdout == ddl("app.effects")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE SCHEMA app")
    for _ in range(2):
        done = zsched("apply", "--postgres", pg_dsn, "--table", "app.effects")
        assert done.returncode == 0, done.stderr
        assert "effects table app.effects ready in 127.0.0.1:" in done.stdout
    with psycopg.connect(pg_dsn) as c:
        assert c.execute("SELECT count(*) FROM app.effects").fetchone() == (0,)


def test_prune_uses_the_namespace_s_tombstone_ttl_unless_given_a_retention(pg_dsn: str, redis_url: str) -> None:
    with Client.from_url(redis_url, namespace="fxns", partitions=1).connect() as client:
        client.set_tombstone_ttl(3600)
    with psycopg.connect(pg_dsn) as c:
        c.execute(ddl())
        c.commit()
        for n in range(3):
            with fenced(c, _job(n, "fxns")):
                pass
        with fenced(c, _job(9, "other")):
            pass
        c.execute("UPDATE zsched_effects SET applied_at = now() - interval '90 minutes' WHERE job_id <> %s",
                  (_job(2, "fxns").id,))
        c.commit()
    out = zsched("prune", "--postgres", pg_dsn, "--redis", redis_url, "--namespace", "fxns", "--batch", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "pruned 2 effects row(s) of namespace fxns older than 1h from zsched_effects"
    out = zsched("prune", "--postgres", pg_dsn, "--retention", "2h", "--all-namespaces", "--json",
                 "--redis", "redis://127.0.0.1:1/0")  # a given retention needs no Redis
    assert out.returncode == 0 and '"deleted": 0' in out.stdout, out.stderr
    out = zsched("prune", "--postgres", pg_dsn, "--retention", "1h", "--all-namespaces")
    assert out.returncode == 0 and "pruned 1 effects row(s) of every namespace" in out.stdout


def test_each_mistake_is_one_error_line_with_its_exit_code_and_no_password(pg_dsn: str) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    cases = [
        (["apply"], 2, "no PostgreSQL given: pass --postgres URL or set ZSCHED_POSTGRES_URL"),
        (["ddl", "--table", "x;drop"], 2, "is not 'name' or 'schema.name'"),
        (["apply", "--postgres", "postgresql://app:s3cret@127.0.0.1:1/db"], 3,
         "cannot connect to PostgreSQL at postgresql://app:***@127.0.0.1:1/db"),
        (["prune", "--postgres", pg_dsn, "--retention", "1h", "--all-namespaces"], 1,
         "the effects table zsched_effects does not exist"),
        (["prune", "--postgres", pg_dsn, "--retention", "1h", "--batch", "0", "--all-namespaces"], 2,
         "--batch must be 1 or more rows"),
    ]
    for argv, code, text in cases:
        out = zsched(*argv, env={**env, "PYTHONPATH": ":".join(sys.path)})
        lines = out.stderr.strip().splitlines()
        assert out.returncode == code and len(lines) == 1 and text in lines[0], (argv, out.returncode, out.stderr)
        assert "s3cret" not in out.stderr + out.stdout and "Traceback" not in out.stderr
