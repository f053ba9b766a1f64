"""deploy/kubernetes (issue 12, section 3): every manifest validates against the Kubernetes 1.37
schemas (kubernetes-validate 1.37.0, strict: unknown fields rejected); the overlay's patches,
merged onto the base as kustomize's strategic merge does for these patches, validate too;
every kustomization.yaml names resources and patches that exist; and the manifests fit the
daemon: the containers' arguments parse with the real ``lightrail`` parser, the probes ask the
health name every serving replica reports, the ConfigMaps' controller.yaml pass the config
schema and their switches' drivers build with the credentials the Secret provides.

There is no kustomize binary here, so the test reads the kustomizations itself. The
ServiceMonitor (``monitoring.coreos.com/v1``, a Prometheus Operator CRD) is not in the
validator's schemas: it is checked against the Service it selects (labels, port name) and
the fields the operator requires (``spec.selector``, ``spec.endpoints``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from lightrail.controller.api.routing import REPLICA_HEALTH
from lightrail.controller.cli.drivers import driver_registry
from lightrail.controller.cli.main import build_parser
from lightrail.controller.config import build_fabric, parse_config
from lightrail.drivers.credentials import CredentialEnviron
from lightrail.drivers.options import DriverContext

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
VERSION = "1.37.0"
CRDS = {"monitoring.coreos.com/v1"}
KUSTOMIZATION_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "patches",
                        "images", "commonAnnotations", "configMapGenerator", "secretGenerator"}
Doc = dict[str, Any]


def docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def key(doc: Doc) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def build(directory: Path) -> dict[tuple[str, str], Doc]:
    """The resources of the kustomization in ``directory``: its resources (files, or
    directories built the same way), namespace set, the patches merged (``merge``)."""
    kz = docs(directory / "kustomization.yaml")[0]
    out: dict[tuple[str, str], Doc] = {}
    for entry in kz.get("resources", []):
        target = directory / entry
        found = build(target) if target.is_dir() else {key(d): d for d in docs(target)}
        out.update(copy.deepcopy(found))
    for doc in out.values():
        if "namespace" in kz and doc["kind"] != "Namespace":
            doc["metadata"]["namespace"] = kz["namespace"]
    for patch in kz.get("patches", []):
        for p in docs(directory / patch["path"]):
            assert key(p) in out, f"{directory / patch['path']}: patches no resource {key(p)}"
            out[key(p)] = merge(out[key(p)], p)
    return out


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge as these patches need it: mappings merged key by key, lists of mappings
    with ``name`` (containers, env, ports, volumes) merged by name, anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for k, v in patch.items():
            merged[k] = merge(base[k], v) if k in base else v
        return merged
    if (isinstance(base, list) and isinstance(patch, list)
            and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        by_name = {x["name"]: x for x in base}
        for x in patch:
            by_name[x["name"]] = merge(by_name[x["name"]], x) if x["name"] in by_name else x
        return list(by_name.values())
    return patch


def manifests() -> list[Path]:
    """Every resource file a kustomization lists (not the patches: they validate merged)."""
    found = []
    for kz_path in kustomizations():
        for entry in docs(kz_path)[0].get("resources", []):
            target = kz_path.parent / entry
            if target.is_file():
                found.append(target)
    return sorted(found)


def test_every_file_is_a_resource_a_patch_or_a_kustomization() -> None:
    listed = set(manifests()) | set(kustomizations())
    for kz_path in kustomizations():
        listed |= {kz_path.parent / p["path"] for p in docs(kz_path)[0].get("patches", [])}
    assert sorted(set(K8S.rglob("*.yaml")) - listed) == []


@pytest.mark.parametrize("kz_path", kustomizations(), ids=lambda p: str(p.parent.relative_to(K8S)))
def test_kustomization_names_what_exists(kz_path: Path) -> None:
    kz = docs(kz_path)[0]
    assert kz["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kz["kind"] == "Kustomization"
    assert set(kz) <= KUSTOMIZATION_FIELDS, set(kz) - KUSTOMIZATION_FIELDS
    for entry in kz.get("resources", []):
        target = kz_path.parent / entry
        assert target.is_file() or (target / "kustomization.yaml").is_file(), entry
    for patch in kz.get("patches", []):
        assert set(patch) <= {"path", "target", "options"}, patch
        assert (kz_path.parent / patch["path"]).is_file(), patch
    for image in kz.get("images", []):
        assert image["name"] and ("newName" in image or "newTag" in image), image
    built = build(kz_path.parent)  # patches find their targets (asserted in build)
    assert built


@pytest.mark.parametrize("path", manifests(), ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_validates(path: Path) -> None:
    for doc in docs(path):
        if doc["apiVersion"] in CRDS:
            continue  # test_service_monitor_selects_the_controller_service
        kubernetes_validate.validate(doc, VERSION, strict=True)


@pytest.mark.parametrize("overlay", [p.parent for p in kustomizations()],
                         ids=lambda p: str(p.relative_to(K8S)))
def test_built_resources_validate(overlay: Path) -> None:
    for doc in build(overlay).values():
        if doc["apiVersion"] not in CRDS:
            kubernetes_validate.validate(doc, VERSION, strict=True)


def test_service_monitor_selects_the_controller_service() -> None:
    built = build(K8S / "base")
    monitor = built["ServiceMonitor", "lightrail-controller"]
    service = built["Service", "lightrail-controller"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"]
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in ports
        assert endpoint.get("path", "/metrics") == "/metrics"


def substitute(args: list[str], env: dict[str, str]) -> list[str]:
    for name, value in env.items():
        args = [a.replace(f"$({name})", value) for a in args]
    return args


@pytest.mark.parametrize("overlay", [p.parent for p in kustomizations()],
                         ids=lambda p: str(p.relative_to(K8S)))
def test_containers_fit_the_daemon(overlay: Path) -> None:
    built = build(overlay)
    parser = build_parser()
    deployment = built["Deployment", "lightrail-controller"]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    controller = next(c for c in pod["containers"] if c["name"] == "controller")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        grpc_probe = controller[probe]["grpc"]
        assert grpc_probe == {"port": 50051, "service": REPLICA_HEALTH}, probe
    for container in [*pod["initContainers"], *pod["containers"]]:
        args = substitute(container["args"], {"POD_IP": "10.0.0.7"})
        parsed = parser.parse_args(args)
        assert parsed.cmd in ("controller", "check-config")
    assert parser.parse_args(substitute(controller["args"], {"POD_IP": "10.0.0.7"})
                             ).advertise == "10.0.0.7:50051"
    agent_pod = built["DaemonSet", "lightrail-agent"]["spec"]["template"]["spec"]
    agent = agent_pod["containers"][0]
    env = {e["name"]: e.get("value", "node-1") for e in agent["env"]}
    parsed = parser.parse_args(substitute(agent["args"], env))
    assert parsed.health == "nvml"
    assert parsed.controller == env["LIGHTRAIL_CONTROLLER"]
    assert parsed.socket.startswith(agent["volumeMounts"][0]["mountPath"] + "/")
    volume = agent_pod["volumes"][0]
    assert volume["hostPath"]["path"] == agent["volumeMounts"][0]["mountPath"]


@pytest.mark.parametrize("overlay", [p.parent for p in kustomizations()],
                         ids=lambda p: str(p.relative_to(K8S)))
def test_config_validates_and_drivers_build_with_the_secret(overlay: Path) -> None:
    built = build(overlay)
    config = yaml.safe_load(built["ConfigMap", "lightrail-controller"]["data"]["controller.yaml"])
    cfg = parse_config(config, f"{overlay.name} ConfigMap")
    secret = built.get(("Secret", "lightrail-device-credentials"))
    environ = CredentialEnviron(dict(secret["stringData"]) if secret else {})
    registry = driver_registry()
    for switch in build_fabric(cfg.fabric).switches.values():
        registry.create(switch.spec, DriverContext(environ=environ))  # raises when missing
