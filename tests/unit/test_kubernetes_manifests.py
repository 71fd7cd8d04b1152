"""deploy/kubernetes/: every manifest checked offline. The core objects against the Kubernetes
OpenAPI schemas (``kubernetes-validate``, strict: an unknown or misspelt field fails) for the
oldest and the newest Kubernetes version we document; KEDA's ScaledObject, a custom resource the
core schemas do not hold, structurally here (its fields as KEDA's CRD names them, the HPA
behaviour part against the core HPA schema it is copied into). Then what no schema knows: the
zsched commands parse with the real CLI, the probes are the paths the processes serve, the
names the objects refer to each other by match, and no secret is written in."""
from __future__ import annotations

import contextlib
import copy
import io
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from scheduler.health import PATHS
from scheduler.shell.cli import build_parser
from scheduler.tier.cli import config_from_args

DIR = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSIONS = ("1.29.0", latest_version())  # oldest documented (docs/operations.md, Kubernetes), newest known
KEDA = ("keda.sh/v1alpha1", "ScaledObject")
# spec fields of KEDA's ScaledObject CRD (keda.sh/v1alpha1, KEDA 2.x)
KEDA_SPEC = {"scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod", "idleReplicaCount",
             "minReplicaCount", "maxReplicaCount", "advanced", "fallback", "triggers"}
KEDA_PROMETHEUS = {"serverAddress", "query", "threshold", "activationThreshold", "namespace", "customHeaders",
                   "ignoreNullValues", "unsafeSsl", "queryParameters"}


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in documents() if d["kind"] == kind]


def deployment(component: str) -> dict[str, Any]:
    (dep,) = [d for d in of_kind("Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return dep


def container(component: str) -> dict[str, Any]:
    (c,) = deployment(component)["spec"]["template"]["spec"]["containers"]
    return c


def test_the_directory_holds_the_objects_the_docs_describe() -> None:
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for _, d in documents())
    assert kinds == ["ConfigMap/zsched-settings", "Deployment/zsched-console", "Deployment/zsched-scheduler",
                     "Deployment/zsched-worker", "PodDisruptionBudget/zsched-scheduler", "ScaledObject/zsched-worker",
                     "Service/zsched-console"]


@pytest.mark.parametrize("version", VERSIONS)
def test_core_objects_match_the_kubernetes_schemas(version: str) -> None:
    checked = 0
    for name, doc in documents():
        if (doc["apiVersion"], doc["kind"]) == KEDA:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']} invalid for Kubernetes {version}: {exc}")
        checked += 1
    assert checked == 6


def test_the_schema_check_catches_a_misspelt_field() -> None:
    doc = copy.deepcopy(deployment("scheduler"))
    c = doc["spec"]["template"]["spec"]["containers"][0]
    c["livenesProbe"] = c.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[0], strict=True)


def test_the_scaled_object_is_well_formed_and_scales_the_workers_on_due_soon() -> None:
    (so,) = of_kind("ScaledObject")
    spec = so["spec"]
    assert so["apiVersion"] == KEDA[0] and so["metadata"]["name"]
    assert set(spec) <= KEDA_SPEC, f"fields KEDA's ScaledObject does not have: {set(spec) - KEDA_SPEC}"
    target = spec["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment",
                                                                     deployment("worker")["metadata"]["name"])
    lo, hi = spec["minReplicaCount"], spec["maxReplicaCount"]
    assert isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi and hi >= 1
    for key in ("pollingInterval", "cooldownPeriod"):
        assert isinstance(spec[key], int) and spec[key] > 0, key
    # the HPA behaviour KEDA passes through is the core autoscaling/v2 one: check it with that schema
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
           "spec": {"scaleTargetRef": target, "maxReplicas": hi, "minReplicas": max(1, lo),
                    **spec["advanced"]["horizontalPodAutoscalerConfig"]}}
    kubernetes_validate.validate(hpa, VERSIONS[-1], strict=True)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    meta = trigger["metadata"]
    assert set(meta) <= KEDA_PROMETHEUS and {"serverAddress", "query", "threshold"} <= set(meta)
    assert all(isinstance(v, str) for v in meta.values()), "KEDA's trigger metadata values are strings"
    assert re.fullmatch(r"https?://[a-z0-9.-]+(:\d+)?/?", meta["serverAddress"]), meta["serverAddress"]
    assert float(meta["threshold"]) > 0 and float(meta["activationThreshold"]) >= 0
    # a sum over the replicas (each exports the partitions it owns), of the zsched namespace the pods use
    ns = of_kind("ConfigMap")[0]["data"]["ZSCHED_NAMESPACE"]
    assert re.fullmatch(rf'sum\(zsched_queue_due_soon\{{namespace="{ns}", queue=~"[a-z|]+"\}}\)', meta["query"])


def argv(component: str) -> list[str]:
    return [str(a) for a in container(component)["args"]]


def test_the_zsched_commands_parse_with_the_real_cli() -> None:
    for component in ("scheduler", "worker", "console"):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = build_parser().parse_args(argv(component))
        except SystemExit:
            pytest.fail(f"{component}: zsched {' '.join(argv(component))}: {err.getvalue().strip()}")
        if component == "scheduler":
            cfg = config_from_args(args)  # the checks of the values too (ranges)
            assert cfg.metrics_port == 9100 and cfg.metrics_host == "0.0.0.0"
        if component == "worker":
            assert args.metrics_port == 9100 and args.metrics_host == "0.0.0.0"
    assert "--read-only" in argv("console"), "the console is read-only by default"


@pytest.mark.parametrize("component", ["scheduler", "worker"])
def test_the_probes_are_the_paths_the_process_serves_on_its_metrics_port(component: str) -> None:
    c = container(component)
    (port,) = c["ports"]
    assert port["containerPort"] == 9100
    probes = {c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]}
    assert probes == set(PATHS) and c["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert {c["livenessProbe"]["httpGet"]["port"], c["readinessProbe"]["httpGet"]["port"]} == {port["name"]}
    annotations = deployment(component)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port["containerPort"])


def test_selectors_and_references_match() -> None:
    for dep in of_kind("Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items(), dep["metadata"]["name"]
    (pdb,) = of_kind("PodDisruptionBudget")
    assert pdb["spec"]["selector"] == deployment("scheduler")["spec"]["selector"]
    (svc,) = of_kind("Service")
    assert svc["spec"]["selector"] == deployment("console")["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["type"] == "ClusterIP", "the console's pages need no login: keep it internal"
    settings = of_kind("ConfigMap")[0]["metadata"]["name"]
    for component in ("scheduler", "worker", "console"):
        c = container(component)
        assert [e["configMapRef"]["name"] for e in c["envFrom"]] == [settings]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs["ZSCHED_REDIS_URL"] == {"name": "zsched-connection", "key": "redis-url"}, component
        if component != "worker":  # workers do not use etcd
            assert refs["ZSCHED_ETCD_ENDPOINTS"] == {"name": "zsched-connection", "key": "etcd-endpoints"}


def test_no_secret_is_written_into_the_manifests() -> None:
    assert not of_kind("Secret"), "make Secrets with kubectl from files (docs/operations.md), never in the repo"
    for name, doc in documents():
        text = yaml.safe_dump(doc)
        assert not re.search(r"(rediss?|https?)://[^/\s:@]+:[^/\s@]+@", text), f"{name}: a URL with a password"
        for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            for e in c.get("env", []):  # settings come from the ConfigMap, connections from the Secret
                assert "value" not in e or not e["name"].startswith("ZSCHED_"), f"{name}: {e['name']} inline"
