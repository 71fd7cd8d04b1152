"""``docker-compose.yml``, the ``Dockerfile``, ``.dockerignore`` and the ``deploy/`` files they mount,
checked without a Docker engine (none runs on these machines): ``docker-compose config -q`` (Debian
package ``docker-compose``, installed by scripts/bootstrap), then the structure of the file, and the
zsched commands it runs against the real CLI parser and a real Redis."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.support.waits import wait_until

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
PROM_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA_PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"
ZSCHED_IMAGE = "zsched:local"
METRICS_PORT = "9100"


def docker_compose() -> str:
    exe = shutil.which("docker-compose")
    assert exe, ("docker-compose not found: it comes from the Debian package 'docker-compose' "
                 "(scripts/bootstrap installs it; or: sudo apt-get install docker-compose)")
    return exe


def load_yaml(path: Path) -> Any:
    """Parse a YAML file. PyYAML is not a dependency of zsched; when the venv lacks it, use the
    interpreter of Debian's docker-compose, which depends on python3-yaml."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:
        return yaml.safe_load(path.read_text())
    candidates = []
    exe = shutil.which("docker-compose")
    if exe:
        with open(exe, "rb") as f:
            first = f.readline()
        if first.startswith(b"#!"):
            candidates.append(first[2:].decode().strip().split()[0])
    candidates.append("/usr/bin/python3")
    for interp in candidates:
        if not os.path.exists(interp):
            continue
        out = subprocess.run([interp, "-c", "import json, sys, yaml; "
                              "json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)", str(path)],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            return json.loads(out.stdout)
    raise AssertionError("no YAML parser: pip install pyyaml, or install docker-compose (it brings python3-yaml)")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def _zsched_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items()
            if "build" in svc or str(svc.get("image", "")).startswith("zsched")}


def _by_subcommand(compose: dict[str, Any], sub: str) -> dict[str, list[str]]:
    return {name: _argv(svc.get("command")) for name, svc in _zsched_services(compose).items()
            if "entrypoint" not in svc and _argv(svc.get("command"))[:1] == [sub]}


def _option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _mounts(svc: dict[str, Any]) -> dict[str, str]:
    """container path -> host path of a service's bind mounts (short syntax)."""
    out = {}
    for v in svc.get("volumes", []):
        parts = v.split(":")
        if len(parts) >= 2 and parts[0].startswith((".", "/")):
            out[parts[1]] = parts[0]
    return out


# --------------------------------------------------------------------------- docker-compose itself


def test_docker_compose_config_is_valid() -> None:
    out = subprocess.run([docker_compose(), "-f", str(COMPOSE), "config", "-q"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"docker-compose config -q failed:\n{out.stdout}\n{out.stderr}"


# --------------------------------------------------------------------------- structure


def test_zsched_services_use_the_image_built_here(compose: dict[str, Any]) -> None:
    zs = _zsched_services(compose)
    assert {"scheduler-1", "scheduler-2", "scheduler-3", "worker-1", "worker-2", "producer"} <= set(zs), sorted(zs)
    for name, svc in zs.items():
        build = svc.get("build")
        context = build.get("context") if isinstance(build, dict) else build
        assert context in (".", "./"), f"{name}: build context is {context!r}, expected the repo root"
        dockerfile = build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile"
        assert (REPO / dockerfile).is_file(), f"{name}: {dockerfile} missing"
        assert svc.get("image") == ZSCHED_IMAGE, f"{name}: image {svc.get('image')!r}, expected {ZSCHED_IMAGE}"
        env = svc.get("environment", {})
        assert env.get("ZSCHED_REDIS_URL") == "redis://redis:6379/0", f"{name}: {env}"
    assert len(_by_subcommand(compose, "scheduler")) == 3
    assert len(_by_subcommand(compose, "worker")) == 2
    for name in _by_subcommand(compose, "scheduler"):
        assert zs[name]["environment"].get("ZSCHED_ETCD_ENDPOINTS") == "etcd:2379", name
        assert {"redis", "etcd"} <= set(zs[name].get("depends_on", {})), name


def test_redis_has_aof_on_and_a_volume(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    argv = _argv(redis.get("command"))
    assert argv[:1] == ["redis-server"], argv
    assert _option(argv, "--appendonly") == "yes", f"redis must run with AOF on (--appendonly yes): {argv}"
    assert any(str(v).endswith(":/data") for v in redis.get("volumes", [])), "redis data must be on a volume"


def test_etcd_is_the_official_image_with_one_member(compose: dict[str, Any]) -> None:
    etcd = compose["services"]["etcd"]
    assert str(etcd["image"]).startswith(("quay.io/coreos/etcd:", "gcr.io/etcd-development/etcd:")), etcd["image"]
    argv = _argv(etcd.get("command"))
    cluster = _option(argv, "--initial-cluster")
    assert cluster and cluster.count("=") == 1, f"expected a single-member cluster: {cluster}"
    assert _option(argv, "--listen-client-urls") == "http://0.0.0.0:2379"
    assert _option(argv, "--advertise-client-urls") == "http://etcd:2379"


def test_metrics_bind_all_interfaces_in_containers_and_prometheus_scrapes_them(compose: dict[str, Any]) -> None:
    prom = load_yaml(PROM_CONFIG)
    jobs = {sc["job_name"]: {t for stc in sc.get("static_configs", []) for t in stc["targets"]}
            for sc in prom["scrape_configs"]}
    for sub, job in (("scheduler", "zsched-scheduler"), ("worker", "zsched-worker")):
        expected = set()
        for name, argv in _by_subcommand(compose, sub).items():
            assert _option(argv, "--metrics-host") == "0.0.0.0", (
                f"{name}: metrics must bind 0.0.0.0 inside the container or Prometheus cannot reach them: {argv}")
            port = _option(argv, "--metrics-port")
            assert port == METRICS_PORT, f"{name}: --metrics-port {port}"
            expected.add(f"{name}:{port}")
        assert jobs.get(job) == expected, f"deploy/prometheus/prometheus.yml job {job}: {jobs.get(job)} != {expected}"


def test_prometheus_mounts_the_scrape_config_and_rules(compose: dict[str, Any]) -> None:
    svc = compose["services"]["prometheus"]
    mounts = _mounts(svc)
    assert mounts.get("/etc/prometheus/prometheus.yml") == "./deploy/prometheus/prometheus.yml", mounts
    prom = load_yaml(PROM_CONFIG)
    for rule_file in prom.get("rule_files", []):
        target = rule_file if rule_file.startswith("/") else f"/etc/prometheus/{rule_file}"
        assert target in mounts, f"rule file {rule_file} is not mounted at {target}: {mounts}"
        assert (REPO / mounts[target]).is_file(), mounts[target]
    config_flag = [a for a in _argv(svc.get("command")) if a.startswith("--config.file=")]
    assert config_flag in ([], ["--config.file=/etc/prometheus/prometheus.yml"]), config_flag


def test_grafana_mounts_provisioning_and_dashboards(compose: dict[str, Any]) -> None:
    svc = compose["services"]["grafana"]
    mounts = _mounts(svc)
    assert mounts.get("/etc/grafana/provisioning") == "./deploy/grafana/provisioning", mounts
    providers = load_yaml(GRAFANA_PROVISIONING / "dashboards" / "zsched.yml")["providers"]
    assert len(providers) == 1 and providers[0]["type"] == "file", providers
    path = providers[0]["options"]["path"]
    assert mounts.get(path) == "./deploy/grafana/dashboards", f"dashboards provider reads {path}; mounts: {mounts}"
    assert list((REPO / "deploy" / "grafana" / "dashboards").glob("*.json")), "no dashboards"
    home = svc.get("environment", {}).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert home.startswith(path + "/"), home
        assert (REPO / "deploy/grafana/dashboards" / home[len(path) + 1:]).is_file(), home
    datasources = load_yaml(GRAFANA_PROVISIONING / "datasources" / "prometheus.yml")["datasources"]
    assert [d["url"] for d in datasources] == ["http://prometheus:9090"], datasources
    assert "prometheus" in compose["services"]


def test_published_ports_are_on_loopback_only(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        for p in svc.get("ports", []):
            assert str(p).startswith("127.0.0.1:"), f"{name} publishes {p} on every interface"


# --------------------------------------------------------------------------- the commands it runs


def test_zsched_commands_are_accepted_by_the_cli(compose: dict[str, Any]) -> None:
    """Every zsched service's command parses with the real ``zsched`` parser (catches options the CLI
    does not have: `config -q` cannot)."""
    from scheduler.shell.cli import build_parser

    errors = []
    for name, svc in _zsched_services(compose).items():
        if "entrypoint" in svc:
            continue
        argv = _argv(svc.get("command"))
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                build_parser().parse_args(argv)
        except SystemExit:
            errors.append(f"{name}: zsched {' '.join(argv)}\n    {err.getvalue().strip().splitlines()[-1]}")
    assert not errors, "compose runs commands the CLI rejects:\n" + "\n".join(errors)


def test_demo_producer_command_schedules_jobs(compose: dict[str, Any], redis_url: str) -> None:
    """Run the producer service's command (outside Docker) against a real Redis for a few seconds."""
    from scheduler import Client

    entry = _argv(compose["services"]["producer"].get("entrypoint"))
    assert entry[:2] == ["python", "-c"], entry
    ns = "composeprod"
    env = {**os.environ, "ZSCHED_REDIS_URL": redis_url, "ZSCHED_NAMESPACE": ns}
    proc = subprocess.Popen([sys.executable, *entry[1:]], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd="/")
    try:
        total = 0

        def produced_or_exited() -> bool:
            nonlocal total
            if proc.poll() is not None:
                return True
            c = Client.from_url(redis_url, namespace=ns)
            try:
                stats = c.stats()
            finally:
                c.close()
            total = sum(sum(s.values()) for s in stats.values())
            return total >= 50 and "emails" in stats

        wait_until(produced_or_exited, 15, 0.1, what=lambda: f"the producer to schedule 50 jobs ({total} so far)")
        assert proc.poll() is None, f"producer exited: {proc.communicate()[0][-2000:]!r}"
        assert total >= 50, f"producer scheduled only {total} jobs"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# --------------------------------------------------------------------------- Dockerfile


def _dockerfile() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instr, _, rest = line.partition(" ")
            out.append((instr.upper(), rest.strip()))
    return out


def test_dockerfile_installs_zsched_with_zsched_as_entrypoint() -> None:
    instrs = _dockerfile()
    assert instrs[0] == ("FROM", "python:3.11-slim"), instrs[0]
    entry = [json.loads(rest) for instr, rest in instrs if instr == "ENTRYPOINT"]
    assert entry and entry[-1] == ["zsched"], entry
    runs = " ".join(rest for instr, rest in instrs if instr == "RUN")
    assert re.search(r"pip install (?!-e)\S+", runs), runs
    assert any(instr == "USER" and rest not in ("root", "0") for instr, rest in instrs), "image should not run as root"


def test_dockerignore_admits_what_the_dockerfile_copies_and_nothing_local() -> None:
    patterns = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.strip().startswith("#")]
    assert patterns[0] == "*", "expected an allowlist .dockerignore (first pattern '*')"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for instr, rest in _dockerfile():
        if instr == "COPY" and not rest.startswith("--from"):
            for src in rest.split()[:-1]:
                if not src.startswith("--"):
                    assert src.rstrip("/") in allowed, f"Dockerfile copies {src}, excluded by .dockerignore"
    for local in (".venv", ".git", ".zsched", "tests", "bench"):
        assert local not in allowed, f".dockerignore lets {local} into the build context"


def test_pip_install_ships_every_package() -> None:
    """The image does a regular ``pip install``: every Python package under scheduler/ and workers/
    must be in pyproject's package list, or the installed ``zsched`` misses subcommands."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = cfg.get("packages")
    if not isinstance(packages, list):
        return  # find-directive: setuptools discovers them
    listed = set(packages)
    missing = []
    for top in ("scheduler", "workers"):
        for init in sorted((REPO / top).rglob("__init__.py")):
            pkg = ".".join(init.parent.relative_to(REPO).parts)
            if "__pycache__" not in pkg and pkg not in listed:
                missing.append(pkg)
    assert not missing, (f"pyproject.toml [tool.setuptools] packages lacks {missing}: `pip install .` (the Docker "
                         f"image) would not contain them")
