"""The platform's Helm chart (``charts/platform-orchestrator``): the server and its managed runners, rendered
with helm-python-sdk.

Every rendered manifest is checked with ``kubernetes-validate --strict`` (the upstream OpenAPI schemas,
unknown fields refused) for the newest Kubernetes it ships and for 1.30. The Secrets the chart generates
(server key, bootstrap token, ``MANAGED_RUNNER_SECRET``) read what the cluster already holds with Helm's
``lookup``: offline rendering answers it with nothing, so those tests render cluster-aware
(``helm_python.Config.render``, what ``helm upgrade`` renders) against the stand-in Kubernetes API
(tests/support/kube_api.py), which holds the Secrets a first install created. No real cluster is involved:
these tests prove the manifests are well-formed and say what we mean, not that a real API server accepts
them.

helm-python-sdk missing: the tests skip, or fail when ``CI`` or ``PO_TEST_REQUIRE_TOOLS`` is set.
"""

from __future__ import annotations

import base64
import shlex
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import yaml

from orchestrator.api import health
from orchestrator.launchers.images import DEFAULT_RUNNER_IMAGE, DEFAULT_SERVER_IMAGE, IMAGE_TAG
from orchestrator.server import create_app
from orchestrator.settings import ServerSettings
from tests.support.docs import commands, docs_example
from tests.support.helm_charts import (
    by_kind,
    env_of,
    import_helm,
    manifest_problems,
    manifests,
    one,
    undocumented_values,
)
from tests.support.helm_charts import merged as merged_values
from tests.support.kube_api import KubeApiServer
from tests.support.kube_schema import schema_problems

CHART = Path(__file__).resolve().parents[2] / "charts" / "platform-orchestrator"
RELEASE = "po"
NAMESPACE = "platform"
FULLNAME = f"{RELEASE}-platform-orchestrator"
RUNNERS = f"{FULLNAME}-managed-runner"
MANAGED_SECRET = f"{RELEASE}-managed-runner"
MANAGED_KEY = "managed-runner-secret"
KEY_SECRET = f"{RELEASE}-encryption-key"
TOKEN_SECRET = f"{RELEASE}-bootstrap-token"
SERVICE_URL = f"http://{FULLNAME}.{NAMESPACE}.svc:8080"
EXPLICIT_SECRET = "an-explicit-managed-runner-secret-of-fifty-characters"
KUBE_TOKEN = "helm-user-token"

#: The chart's defaults need no value: SQLite on the data volume, everything else generated.
DEFAULTS: dict[str, Any] = {}
POSTGRES = {"database": {"existingSecret": "po-database", "existingSecretKey": "url"}}
#: Generated on first install, kept by lookup: Secret name -> data key.
GENERATED = {MANAGED_SECRET: MANAGED_KEY, KEY_SECRET: "encryption-key", TOKEN_SECRET: "token"}


@pytest.fixture(scope="module")
def helm() -> ModuleType:
    return import_helm()


@pytest.fixture(scope="module")
def chart(helm: ModuleType) -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def merged(*overrides: dict[str, Any]) -> dict[str, Any]:
    return merged_values(DEFAULTS, *overrides)


def render(chart: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every manifest the chart renders offline for ``values``, each valid by the strict schemas."""
    rendered = manifests(chart.render(values, name=RELEASE, namespace=NAMESPACE))
    assert rendered
    problems = [
        f"{m['kind']} {m['metadata']['name']}: {problem}"
        for m in rendered
        for problem in manifest_problems(m)
    ]
    assert problems == []
    return rendered


def pod_spec(rendered: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    result: dict[str, Any] = one(rendered, kind)["spec"]["template"]["spec"]
    return result


def container(rendered: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (only,) = pod_spec(rendered, kind)["containers"]
    result: dict[str, Any] = only
    return result


def secret_value(rendered: list[dict[str, Any]], name: str, key: str) -> str:
    return base64.b64decode(one(rendered, "Secret", name)["data"][key]).decode()


def secret_ref(env: dict[str, dict[str, Any]], variable: str) -> dict[str, Any]:
    result: dict[str, Any] = env[variable]["valueFrom"]["secretKeyRef"]
    return result


# -- default values ----------------------------------------------------------------------------------


def test_defaults__render_valid_manifests(chart: Any) -> None:
    rendered = render(chart, DEFAULTS)
    assert sorted((m["kind"], m["metadata"]["name"]) for m in rendered) == sorted(
        [
            ("Deployment", FULLNAME),
            ("Service", FULLNAME),
            ("ServiceAccount", FULLNAME),
            ("PersistentVolumeClaim", f"{FULLNAME}-data"),
            ("Secret", KEY_SECRET),
            ("Secret", TOKEN_SECRET),
            ("Secret", MANAGED_SECRET),
            ("StatefulSet", RUNNERS),
            ("Service", RUNNERS),
            ("ServiceAccount", RUNNERS),
        ]
    )
    assert all(m["metadata"]["namespace"] == NAMESPACE for m in rendered)


def test_chart__app_version_tags_our_images() -> None:
    """The images default to ours (launchers/images.py), tagged with the chart's appVersion."""
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == IMAGE_TAG


def test_server__runs_orchestrator_serve_with_the_generated_secrets(chart: Any) -> None:
    rendered = render(chart, DEFAULTS)
    deployment = one(rendered, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    server = container(rendered, "Deployment")
    assert server["image"] == DEFAULT_SERVER_IMAGE
    assert server["args"] == ["serve"]  # the image's entrypoint is `orchestrator`
    assert "command" not in server
    env = env_of(server)
    assert env["PO_LISTEN"]["value"] == "0.0.0.0:8080"
    assert env["PO_PUBLIC_URL"]["value"] == SERVICE_URL
    assert env["PO_LOG_LEVEL"]["value"] == "info"
    assert env["PO_LOG_FORMAT"]["value"] == "json"
    assert secret_ref(env, "PO_ENCRYPTION_KEY") == {"name": KEY_SECRET, "key": "encryption-key"}
    assert secret_ref(env, "PO_BOOTSTRAP_TOKEN") == {"name": TOKEN_SECRET, "key": "token"}
    assert secret_ref(env, "MANAGED_RUNNER_SECRET") == {"name": MANAGED_SECRET, "key": MANAGED_KEY}
    # No database Secret: SQLite in the data directory, on the claim, one pod at a time.
    assert "PO_DATABASE_URL" not in env
    assert not {"PO_OBJECT_STORE_URL", "PO_OBJECT_STORE_ENDPOINT"} & set(env)
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(rendered, "Deployment")["volumes"]}
    data = volumes[mounts["/var/lib/platform-orchestrator"]]
    assert data["persistentVolumeClaim"]["claimName"] == f"{FULLNAME}-data"
    # The server makes its data dir private (chmod 0700): a directory of its own, not the volume's root.
    assert Path(env["PO_DATA_DIR"]["value"]).parent == Path("/var/lib/platform-orchestrator")
    assert volumes[mounts["/tmp"]]["emptyDir"] == {}
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    claim = one(rendered, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"


def test_server__secure_defaults_and_no_kubernetes_token(chart: Any) -> None:
    rendered = render(chart, DEFAULTS)
    pod = pod_spec(rendered, "Deployment")
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == FULLNAME
    assert one(rendered, "ServiceAccount", FULLNAME)["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the server image's user
    assert pod["securityContext"]["fsGroup"] == 10001
    context = container(rendered, "Deployment")["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}


async def test_server__probes_ask_paths_the_server_answers(chart: Any, tmp_path: Path) -> None:
    """Startup and liveness probes ask ``/healthz``, the readiness probe ``/readyz``, on the port the server
    listens on; the server's app answers both 200 (``/healthz`` even before its lifespan ran: no
    database), within the readiness probe's timeout."""
    server = container(render(chart, DEFAULTS), "Deployment")
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    listen_port = int(env_of(server)["PO_LISTEN"]["value"].rpartition(":")[2])
    paths = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = server[probe]["httpGet"]
        assert ports[get["port"]] == listen_port
        assert get["scheme"] == "HTTP"
        paths[probe] = get["path"]
    assert paths == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    # Two readiness checks run side by side, each given up after its timeout.
    assert server["readinessProbe"]["timeoutSeconds"] >= 2 * health.CHECK_TIMEOUT_SECONDS

    settings = ServerSettings(data_dir=tmp_path / "data", local_runs_dir=tmp_path / "runs")
    app = create_app(settings, run_migrations=False, run_dispatcher=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test") as client:
        response = await client.get("/healthz")
    assert response.status_code == 200
    app = create_app(settings, run_dispatcher=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test") as client,
    ):
        ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text


def test_server__sigterm_grace_within_the_pods_termination_grace(chart: Any) -> None:
    for values, grace in ((DEFAULTS, 20), (merged({"shutdownGraceSeconds": 45}), 45)):
        rendered = render(chart, values)
        env = env_of(container(rendered, "Deployment"))
        assert env["PO_SHUTDOWN_GRACE_SECONDS"]["value"] == str(grace)
        assert pod_spec(rendered, "Deployment")["terminationGracePeriodSeconds"] > grace


TLS = {"tls": {"secretName": "po-tls"}}


def test_tls__secret_mounted_as_a_directory_wired_to_the_server_and_probes(chart: Any) -> None:
    rendered = render(chart, merged(TLS))
    server = container(rendered, "Deployment")
    env = env_of(server)
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(rendered, "Deployment")["volumes"]}
    tls_dir = Path(env["PO_TLS_CERT_FILE"]["value"]).parent

    # A renewed Secret reaches the pod only through a directory mount (never subPath).
    assert mounts["tls"]["mountPath"] == str(tls_dir) and "subPath" not in mounts["tls"]
    assert Path(env["PO_TLS_KEY_FILE"]["value"]) == tls_dir / "tls.key"
    assert Path(env["PO_TLS_CERT_FILE"]["value"]) == tls_dir / "tls.crt"
    assert volumes["tls"]["secret"]["secretName"] == "po-tls"
    assert {i["key"] for i in volumes["tls"]["secret"]["items"]} == {"tls.crt", "tls.key"}
    assert {server[p]["httpGet"]["scheme"] for p in ("startupProbe", "readinessProbe", "livenessProbe")} == {
        "HTTPS"
    }
    assert "PO_TLS_CLIENT_CA_FILE" not in env
    # The Service's URL (PO_PUBLIC_URL, the managed runners' RUNNER_URL) is https; the runners trust the CA
    # cert-manager puts in the Secret, if it has one.
    https_url = SERVICE_URL.replace("http://", "https://")
    assert env["PO_PUBLIC_URL"]["value"] == https_url
    runner_env = env_of(container(rendered, "StatefulSet"))
    assert runner_env["RUNNER_URL"]["value"] == https_url
    assert secret_ref(runner_env, "RUNNER_GATEWAY_CA") == {
        "name": "po-tls",
        "key": "ca.crt",
        "optional": True,
    }
    plain = env_of(container(render(chart, DEFAULTS), "Deployment"))
    assert not {"PO_TLS_CERT_FILE", "PO_TLS_KEY_FILE"} & set(plain)


def test_tls__client_ca_required_on_the_gateway(helm: ModuleType, chart: Any) -> None:
    values = merged(
        TLS, {"tls": {"clientCa": {"secretName": "po-clients"}}, "managedRunners": {"enabled": False}}
    )
    rendered = render(chart, values)
    server = container(rendered, "Deployment")
    env = env_of(server)
    volumes = {v["name"]: v for v in pod_spec(rendered, "Deployment")["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}

    assert env["PO_TLS_CLIENT_CA_FILE"]["value"] == f"{mounts['client-ca']}/ca.crt"
    assert env["PO_TLS_CLIENT_AUTH"]["value"] == "gateway"
    assert volumes["client-ca"]["secret"]["secretName"] == "po-clients"
    # Managed runners present no client certificate: the chart says so instead of rendering a broken pool.
    with pytest.raises(helm.HelmError, match="managed runners do not present"):
        chart.render(merged(values, {"managedRunners": {"enabled": True}}), name=RELEASE, namespace=NAMESPACE)
    optional = merged(values, {"managedRunners": {"enabled": True}, "tls": {"clientAuth": "optional"}})
    assert (
        env_of(container(render(chart, optional), "Deployment"))["PO_TLS_CLIENT_AUTH"]["value"] == "optional"
    )
    with pytest.raises(helm.HelmError, match=r"needs tls\.secretName"):
        chart.render(
            merged({"tls": {"clientCa": {"secretName": "po-clients"}}}), name=RELEASE, namespace=NAMESPACE
        )


def test_service__selects_the_server_pods_only(chart: Any) -> None:
    rendered = render(chart, DEFAULTS)
    service = one(rendered, "Service", FULLNAME)
    selector = service["spec"]["selector"]
    server_labels = one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    runner_labels = one(rendered, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= server_labels.items()
    assert not selector.items() <= runner_labels.items()
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    assert SERVICE_URL == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:8080"


# -- metrics -----------------------------------------------------------------------------------------

SERVICE_MONITOR = {
    "metrics": {"serviceMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "prom"}}}
}
SCRAPE_ANNOTATIONS = {"prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path"}


async def test_metrics__annotated_pods_and_a_path_the_server_answers(chart: Any, tmp_path: Path) -> None:
    """By default the server pods carry scrape annotations naming the port the server listens on and a path
    its app answers with Prometheus' text format; no ServiceMonitor."""
    rendered = render(chart, DEFAULTS)
    server = container(rendered, "Deployment")
    annotations = one(rendered, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert "true" == annotations["prometheus.io/scrape"]
    assert ports["http"] == int(annotations["prometheus.io/port"])
    assert "true" == env_of(server)["PO_METRICS_ENABLED"]["value"]
    assert [] == by_kind(rendered, "ServiceMonitor")

    settings = ServerSettings(data_dir=tmp_path / "data", local_runs_dir=tmp_path / "runs")
    app = create_app(settings, run_migrations=False, run_dispatcher=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test") as client:
        response = await client.get(annotations["prometheus.io/path"])
    assert 200 == response.status_code
    assert response.headers["content-type"].startswith("text/plain; version=")
    assert "# TYPE po_http_requests_total counter" in response.text


async def test_metrics_disabled__no_annotations_and_no_route(chart: Any, tmp_path: Path) -> None:
    rendered = render(chart, merged({"metrics": {"enabled": False}}))
    template = one(rendered, "Deployment")["spec"]["template"]["metadata"]
    assert not SCRAPE_ANNOTATIONS & set(template.get("annotations", {}))
    assert "false" == env_of(container(rendered, "Deployment"))["PO_METRICS_ENABLED"]["value"]

    settings = ServerSettings(
        data_dir=tmp_path / "data", local_runs_dir=tmp_path / "runs", metrics_enabled=False
    )
    app = create_app(settings, run_migrations=False, run_dispatcher=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://po.test") as client:
        response = await client.get("/metrics")
    assert 404 == response.status_code


def test_service_monitor__scrapes_the_server_service_only(chart: Any) -> None:
    rendered = render(chart, merged(SERVICE_MONITOR))
    monitor = one(rendered, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    server_service = one(rendered, "Service", FULLNAME)
    runners_service = one(rendered, "Service", RUNNERS)
    assert selector.items() <= server_service["metadata"]["labels"].items()
    assert not selector.items() <= runners_service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert {"port": "http", "path": "/metrics", "interval": "30s"} == endpoint
    assert endpoint["port"] in {p["name"] for p in server_service["spec"]["ports"]}
    assert [NAMESPACE] == monitor["spec"]["namespaceSelector"]["matchNames"]
    assert "prom" == monitor["metadata"]["labels"]["release"]
    assert [] == manifest_problems(monitor)


def test_service_monitor__refused_without_metrics(helm: ModuleType, chart: Any) -> None:
    values = merged(SERVICE_MONITOR, {"metrics": {"enabled": False}})
    with pytest.raises(helm.HelmError, match=r"metrics\.serviceMonitor\.enabled needs metrics\.enabled"):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_service_monitor__the_check_finds_a_bad_one() -> None:
    """The ServiceMonitor check (kubernetes-validate has no schema for it) can fail."""
    bad = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m", "labels": {"a": 1}},
        "spec": {
            "selector": {"matchLabels": {}},
            "endpoints": [{"port": "http", "interval": "soon", "x": 1}],
        },
    }
    assert 3 == len(manifest_problems(bad)), manifest_problems(bad)


# -- managed runners ---------------------------------------------------------------------------------


def test_managed_runners__po_runner_managed_with_seed_004s_environment(chart: Any) -> None:
    rendered = render(chart, DEFAULTS)
    statefulset = one(rendered, "StatefulSet")
    assert statefulset["spec"]["replicas"] == 1
    assert statefulset["spec"]["serviceName"] == one(rendered, "Service", RUNNERS)["metadata"]["name"]
    assert one(rendered, "Service", RUNNERS)["spec"]["clusterIP"] == "None"
    runner = container(rendered, "StatefulSet")
    assert runner["image"] == DEFAULT_RUNNER_IMAGE
    assert runner["args"] == ["managed"]  # the entrypoint /opt/runner/runner execs po-runner with them
    assert "command" not in runner
    env = env_of(runner)
    assert env["RUNNER_URL"]["value"] == SERVICE_URL
    # The runners and the server read the same Secret: the runners as a file (mode 0400), never a variable.
    assert "RUNNER_MANAGED_SECRET" not in env
    secret_path = Path(env["RUNNER_MANAGED_SECRET_FILE"]["value"])
    (secret_volume,) = [v for v in pod_spec(rendered, "StatefulSet")["volumes"] if "secret" in v]
    assert secret_volume["secret"] == {
        "secretName": MANAGED_SECRET,
        "defaultMode": 0o400,
        "items": [{"key": MANAGED_KEY, "path": secret_path.name}],
    }
    assert {"mountPath": str(secret_path.parent), "name": secret_volume["name"], "readOnly": True} in runner[
        "volumeMounts"
    ]
    assert env["RUNNER_RUN_UIDS"]["value"] == "2300000-2300999"
    assert env["RUNNER_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "RUNNER_TAGS" not in env  # no tags of its own: only the detected ones
    # Their logs as the server's.
    assert ("info", "json") == (env["PO_LOG_LEVEL"]["value"], env["PO_LOG_FORMAT"]["value"])
    mounts = {m["mountPath"]: m for m in runner["volumeMounts"]}
    # The runner makes its work dir private (chmod 0700): a directory of its own, not the mount's root.
    assert str(Path(env["RUNNER_WORK_DIR"]["value"]).parent) in mounts
    assert pod_spec(rendered, "StatefulSet")["terminationGracePeriodSeconds"] == 45
    (work,) = [v for v in pod_spec(rendered, "StatefulSet")["volumes"] if "emptyDir" in v]
    assert work["emptyDir"] == {"sizeLimit": "4Gi"}
    # Everything a runner writes is on that volume (the root file system is read-only; the secret's is not).
    assert {m["name"] for m in mounts.values() if not m.get("readOnly")} == {work["name"]}
    assert {"/tmp", "/home/runner"} <= set(mounts)
    assert runner["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"},
        "limits": {"cpu": "2", "memory": "2Gi"},
    }


def test_managed_runners__no_kubernetes_api_access(chart: Any) -> None:
    """No service account token in the runner pods, a ServiceAccount of their own (not the server's,
    which may carry cloud identity), and no RBAC object at all in the chart."""
    rendered = render(chart, DEFAULTS)
    pod = pod_spec(rendered, "StatefulSet")
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == RUNNERS != FULLNAME
    assert one(rendered, "ServiceAccount", RUNNERS)["automountServiceAccountToken"] is False
    kinds = {m["kind"] for m in rendered}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    mounts = {m["mountPath"] for m in container(rendered, "StatefulSet")["volumeMounts"]}
    assert not any(path.startswith("/var/run/secrets") for path in mounts)


def test_managed_runners__root_with_six_capabilities_to_run_each_deployment_as_its_own_uid(
    chart: Any,
) -> None:
    """By default (runUids) the runner switches each deployment to a uid of its own: root, read-only, with
    only the capabilities that needs (all within Pod Security "baseline"), no privilege escalation."""
    rendered = render(chart, DEFAULTS)
    pod = pod_spec(rendered, "StatefulSet")["securityContext"]
    assert (pod["runAsNonRoot"], pod["runAsUser"], pod["runAsGroup"]) == (False, 0, 0)
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container(rendered, "StatefulSet")["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    baseline = {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
    assert context["capabilities"]["drop"] == ["ALL"]
    assert set(context["capabilities"]["add"]) == {
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "KILL",
        "SETGID",
        "SETUID",
    }
    assert set(context["capabilities"]["add"]) <= baseline


def test_managed_runners__without_run_uids_non_root_read_only_no_capabilities(chart: Any) -> None:
    rendered = render(chart, {"managedRunners": {"runUids": ""}})
    pod = pod_spec(rendered, "StatefulSet")["securityContext"]
    assert (pod["runAsNonRoot"], pod["runAsUser"], pod["runAsGroup"]) == (True, 65534, 65534)
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container(rendered, "StatefulSet")["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}


def test_managed_runners_disabled__statefulset_gone_secret_kept(chart: Any) -> None:
    """enabled: false removes the runners and turns managed runners off in the server (no
    MANAGED_RUNNER_SECRET: the pool is not listed); the Secret stays, for when they come back."""
    rendered = render(chart, merged({"managedRunners": {"enabled": False}}))
    assert not by_kind(rendered, "StatefulSet")
    assert {m["metadata"]["name"] for m in rendered if m["kind"] in ("Service", "ServiceAccount")} == {
        FULLNAME
    }
    assert len(secret_value(rendered, MANAGED_SECRET, MANAGED_KEY)) >= 48
    assert "MANAGED_RUNNER_SECRET" not in env_of(container(rendered, "Deployment"))


def test_managed_runners_zero_replicas__stopped_pool_kept(chart: Any) -> None:
    """replicas: 0 stops the runners; the server keeps the pool (its deployments wait for runners)."""
    rendered = render(chart, merged({"managedRunners": {"replicas": 0}}))
    assert one(rendered, "StatefulSet")["spec"]["replicas"] == 0
    assert "MANAGED_RUNNER_SECRET" in env_of(container(rendered, "Deployment"))


def test_managed_runners_tags__joined_into_runner_tags(chart: Any) -> None:
    rendered = render(chart, merged({"managedRunners": {"tags": ["gpu", "eu-west.1", "kubernetes"]}}))
    env = env_of(container(rendered, "StatefulSet"))
    assert env["RUNNER_TAGS"]["value"] == "gpu,eu-west.1,kubernetes"
    # The server lets runners registering with the shared secret serve exactly those and the detected ones.
    server = env_of(container(rendered, "Deployment"))
    assert server["PO_MANAGED_SECRET_TAGS"]["value"] == "linux,docker,gpu,eu-west.1,kubernetes"


def test_log_settings__server_and_managed_runners_alike(chart: Any) -> None:
    rendered = render(chart, merged({"logLevel": "debug", "logFormat": "console"}))
    for kind in ("Deployment", "StatefulSet"):
        env = env_of(container(rendered, kind))
        assert ("debug", "console") == (env["PO_LOG_LEVEL"]["value"], env["PO_LOG_FORMAT"]["value"]), kind


def test_log_format__anything_else_refused(helm: ModuleType, chart: Any) -> None:
    with pytest.raises(helm.HelmError, match='logFormat must be json or console, not "text"'):
        chart.render(merged({"logFormat": "text"}), name=RELEASE, namespace=NAMESPACE)


@pytest.mark.parametrize("tag", ["GPU", "-gpu", "gpu tag", "a" * 64, ""])
def test_managed_runners_tags__bad_tag_refused(helm: ModuleType, chart: Any, tag: str) -> None:
    with pytest.raises(helm.HelmError, match=r"managedRunners\.tags: .* is not a tag"):
        chart.render(merged({"managedRunners": {"tags": ["ok", tag]}}), name=RELEASE, namespace=NAMESPACE)


def test_managed_runners_secret__explicit_value_used(chart: Any) -> None:
    rendered = render(chart, merged({"managedRunners": {"secret": EXPLICIT_SECRET}}))
    assert secret_value(rendered, MANAGED_SECRET, MANAGED_KEY) == EXPLICIT_SECRET
    encoded = base64.b64encode(EXPLICIT_SECRET.encode()).decode()
    for manifest in rendered:
        text = yaml.safe_dump(manifest)
        assert EXPLICIT_SECRET not in text, manifest["kind"]
        if manifest["kind"] != "Secret":
            assert encoded not in text, manifest["kind"]


def test_managed_runners_secret__a_changed_one_restarts_server_and_runners(chart: Any) -> None:
    def checksums(values: dict[str, Any]) -> set[str | None]:
        rendered = render(chart, values)
        return {
            (one(rendered, kind)["spec"]["template"]["metadata"].get("annotations") or {}).get(
                "checksum/managed-runner-secret"
            )
            for kind in ("Deployment", "StatefulSet")
        }

    assert checksums(DEFAULTS) == {None}  # a generated secret never changes
    (first,) = checksums(merged({"managedRunners": {"secret": EXPLICIT_SECRET}}))
    (second,) = checksums(merged({"managedRunners": {"secret": EXPLICIT_SECRET.upper()}}))
    assert first is not None and second is not None and first != second


def test_managed_runners_secret__shorter_than_48_refused(helm: ModuleType, chart: Any) -> None:
    with pytest.raises(
        helm.HelmError, match=r"managedRunners\.secret must be at least 48 characters \(it has 47\)"
    ):
        chart.render(merged({"managedRunners": {"secret": "s" * 47}}), name=RELEASE, namespace=NAMESPACE)


def test_managed_runners__image_and_scheduling_overrides(chart: Any) -> None:
    values = merged(
        {
            "imagePullSecrets": [{"name": "registry"}],
            "managedRunners": {
                "replicas": 5,
                "image": {
                    "repository": "registry.example.com/runner",
                    "tag": "9.9.9",
                    "pullPolicy": "Always",
                },
                "resources": {"requests": {"cpu": "1"}},
                "workDirSize": "20Gi",
                "extraEnvVars": [{"name": "RUNNER_GATEWAY_CA", "value": "pem"}],
                "podAnnotations": {"example.com/team": "platform"},
                "podLabels": {"team": "platform"},
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "runners", "operator": "Exists", "effect": "NoSchedule"}],
            },
        }
    )
    rendered = render(chart, values)
    statefulset = one(rendered, "StatefulSet")
    assert statefulset["spec"]["replicas"] == 5
    template = statefulset["spec"]["template"]
    assert template["metadata"]["annotations"] == {"example.com/team": "platform"}
    assert template["metadata"]["labels"]["team"] == "platform"
    pod = template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "runners"
    assert pod["volumes"][0]["emptyDir"] == {"sizeLimit": "20Gi"}
    runner = container(rendered, "StatefulSet")
    assert runner["image"] == "registry.example.com/runner:9.9.9"
    assert runner["imagePullPolicy"] == "Always"
    # Helm merges maps: the seed's other defaults stay.
    assert runner["resources"] == {
        "requests": {"cpu": "1", "memory": "512Mi"},
        "limits": {"cpu": "2", "memory": "2Gi"},
    }
    assert env_of(runner)["RUNNER_GATEWAY_CA"]["value"] == "pem"
    # The server's image is its own.
    assert container(rendered, "Deployment")["image"] == DEFAULT_SERVER_IMAGE


# -- database, object store, replicas ----------------------------------------------------------------


def test_existing_database_secret__postgresql_url_from_it(chart: Any) -> None:
    rendered = render(chart, merged(POSTGRES))
    env = env_of(container(rendered, "Deployment"))
    assert secret_ref(env, "PO_DATABASE_URL") == {"name": "po-database", "key": "url"}
    # The chart never writes the database URL itself.
    assert {m["metadata"]["name"] for m in by_kind(rendered, "Secret")} == set(GENERATED)


def test_replicas__postgresql_and_s3_roll_without_a_volume(chart: Any) -> None:
    values = merged(
        POSTGRES,
        {
            "replicaCount": 3,
            "objectStore": {"url": "s3://bundles/po", "endpoint": "http://minio:9000"},
            "persistence": {"enabled": False},
        },
    )
    rendered = render(chart, values)
    deployment = one(rendered, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert "strategy" not in deployment["spec"]  # RollingUpdate
    assert not by_kind(rendered, "PersistentVolumeClaim")
    env = env_of(container(rendered, "Deployment"))
    assert env["PO_OBJECT_STORE_URL"]["value"] == "s3://bundles/po"
    assert env["PO_OBJECT_STORE_ENDPOINT"]["value"] == "http://minio:9000"
    volumes = {v["name"]: v for v in pod_spec(rendered, "Deployment")["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}


def test_replicas__shared_read_write_many_volume(chart: Any) -> None:
    values = merged(
        POSTGRES,
        {"replicaCount": 2, "persistence": {"accessModes": ["ReadWriteMany"], "storageClass": "nfs"}},
    )
    rendered = render(chart, values)
    assert "strategy" not in one(rendered, "Deployment")["spec"]
    claim = one(rendered, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == "nfs"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"replicaCount": 2}, "replicaCount > 1 needs PostgreSQL: set database.existingSecret"),
        ({**POSTGRES, "replicaCount": 2}, "replicaCount > 1 needs a shared object store"),
        (
            {**POSTGRES, "replicaCount": 2, "persistence": {"enabled": False}},
            "replicaCount > 1 needs a shared object store",
        ),
    ],
    ids=["sqlite", "read-write-once-volume", "no-volume"],
)
def test_replicas__refused_without_shared_storage(
    helm: ModuleType, chart: Any, override: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError, match=message.replace(".", r"\.")):
        chart.render(merged(override), name=RELEASE, namespace=NAMESPACE)


def test_existing_key_and_token_secrets__not_generated(chart: Any) -> None:
    values = merged(
        {
            "encryptionKey": {"existingSecret": "server-key", "existingSecretKey": "key"},
            "bootstrapToken": {"existingSecret": "admin", "existingSecretKey": "admin-token"},
            "persistence": {"existingClaim": "po-data"},
        }
    )
    rendered = render(chart, values)
    assert [m["metadata"]["name"] for m in by_kind(rendered, "Secret")] == [MANAGED_SECRET]
    assert not by_kind(rendered, "PersistentVolumeClaim")
    env = env_of(container(rendered, "Deployment"))
    assert secret_ref(env, "PO_ENCRYPTION_KEY") == {"name": "server-key", "key": "key"}
    assert secret_ref(env, "PO_BOOTSTRAP_TOKEN") == {"name": "admin", "key": "admin-token"}
    volumes = {v["name"]: v for v in pod_spec(rendered, "Deployment")["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "po-data"}


# -- generated Secrets: first install, upgrades ------------------------------------------------------


def test_generated_secrets__fresh_values_in_the_form_the_server_takes(chart: Any) -> None:
    """Without a cluster (first install) each render generates new values: the server key is base64 of
    32 bytes (PO_ENCRYPTION_KEY), the managed runner secret at least 48 characters."""
    first, second = render(chart, DEFAULTS), render(chart, DEFAULTS)
    for name, key in GENERATED.items():
        assert secret_value(first, name, key) != secret_value(second, name, key), name
    assert len(base64.b64decode(secret_value(first, KEY_SECRET, "encryption-key"), validate=True)) == 32
    assert len(secret_value(first, MANAGED_SECRET, MANAGED_KEY)) >= 48
    assert len(secret_value(first, TOKEN_SECRET, "token")) >= 32


def test_generated_secrets__server_key_survives_uninstall(chart: Any) -> None:
    rendered = render(chart, DEFAULTS)
    annotations = one(rendered, "Secret", KEY_SECRET)["metadata"].get("annotations", {})
    assert annotations == {"helm.sh/resource-policy": "keep"}
    for name in (MANAGED_SECRET, TOKEN_SECRET):
        assert "annotations" not in one(rendered, "Secret", name)["metadata"]


@dataclass(frozen=True)
class Cluster:
    api: KubeApiServer
    ca_file: Path
    #: A ``helm_python.Config`` for it.
    config: Any


@pytest.fixture
def cluster(tmp_path: Path, helm: ModuleType) -> Iterator[Cluster]:
    """The stand-in Kubernetes API with namespace ``platform`` and a Helm configuration for it."""
    with KubeApiServer(
        tmp_path / "kube",
        auth="token",
        tokens=[KUBE_TOKEN],
        namespaces=[NAMESPACE],
        kubelet=False,
        in_cluster=False,
    ) as api:
        ca_file = tmp_path / "ca.pem"
        ca_file.write_bytes(api.ca.pem)
        config = helm.Config(
            kube_apiserver=api.url, kube_token=KUBE_TOKEN, kube_ca_file=ca_file, namespace=NAMESPACE
        )
        with config:
            yield Cluster(api, ca_file, config)


def cluster_render(
    chart: Any, cluster: Cluster, values: dict[str, Any], *, upgrade: bool
) -> list[dict[str, Any]]:
    """What ``helm install``/``helm upgrade`` renders: ``lookup`` reads the cluster."""
    files = cluster.config.render(
        chart, values, name=RELEASE, namespace=NAMESPACE, is_install=not upgrade, is_upgrade=upgrade
    )
    rendered = manifests(files)
    assert [p for m in rendered for p in schema_problems(m)] == []
    return rendered


def apply_secrets(cluster: Cluster, rendered: list[dict[str, Any]]) -> None:
    """Create the rendered Secrets in the stand-in, as ``helm install`` does."""
    with httpx.Client(
        base_url=cluster.api.url,
        headers={"Authorization": f"Bearer {KUBE_TOKEN}"},
        verify=ssl.create_default_context(cafile=cluster.ca_file),
    ) as client:
        for secret in by_kind(rendered, "Secret"):
            response = client.post(f"/api/v1/namespaces/{NAMESPACE}/secrets", json=secret)
            assert response.status_code == 201, response.text


def test_generated_secrets__kept_across_upgrades(chart: Any, cluster: Cluster) -> None:
    """Install renders new values (the cluster has none); once they are stored, an upgrade renders the
    same values again (lookup), where an offline render would make new ones."""
    installed = cluster_render(chart, cluster, DEFAULTS, upgrade=False)
    apply_secrets(cluster, installed)

    upgraded = cluster_render(chart, cluster, merged({"managedRunners": {"replicas": 3}}), upgrade=True)

    for name, key in GENERATED.items():
        assert secret_value(upgraded, name, key) == secret_value(installed, name, key), name
    assert one(upgraded, "StatefulSet")["spec"]["replicas"] == 3
    looked_up = {c.path for c in cluster.api.calls if c.method == "GET" and "/secrets/" in c.path}
    assert looked_up == {f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}" for name in GENERATED}


def test_generated_secrets__kept_while_managed_runners_are_off(chart: Any, cluster: Cluster) -> None:
    """Turning managed runners off and on again keeps the secret the runners know."""
    installed = cluster_render(chart, cluster, DEFAULTS, upgrade=False)
    apply_secrets(cluster, installed)
    original = secret_value(installed, MANAGED_SECRET, MANAGED_KEY)

    off = cluster_render(chart, cluster, merged({"managedRunners": {"enabled": False}}), upgrade=True)
    on_again = cluster_render(chart, cluster, DEFAULTS, upgrade=True)

    assert not by_kind(off, "StatefulSet")
    assert secret_value(off, MANAGED_SECRET, MANAGED_KEY) == original
    assert secret_value(on_again, MANAGED_SECRET, MANAGED_KEY) == original


def test_generated_secrets__explicit_secret_wins_over_the_stored_one(chart: Any, cluster: Cluster) -> None:
    apply_secrets(cluster, cluster_render(chart, cluster, DEFAULTS, upgrade=False))

    upgraded = cluster_render(
        chart, cluster, merged({"managedRunners": {"secret": EXPLICIT_SECRET}}), upgrade=True
    )

    assert secret_value(upgraded, MANAGED_SECRET, MANAGED_KEY) == EXPLICIT_SECRET


# -- strict schemas, every value set; lint; documentation --------------------------------------------

RUNNER_KINDS = ["StatefulSet", "Service", "ServiceAccount"]
SERVER_KINDS = ["Deployment", "Service", "ServiceAccount", "Secret", "Secret", "Secret"]
EVERYTHING = merged(
    POSTGRES,
    {
        "replicaCount": 2,
        "image": {"repository": "registry.example.com/orchestrator", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "registry"}],
        "nameOverride": "po",
        "publicUrl": "https://po.example.com",
        "logLevel": "debug",
        "objectStore": {"url": "s3://bundles", "endpoint": "https://s3.example.com"},
        "persistence": {"enabled": False},
        "extraEnvVars": [{"name": "AWS_REGION", "value": "eu-west-1"}],
        "service": {"type": "LoadBalancer", "port": 443},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/po"}},
        "podAnnotations": {"a": "b"},
        "podLabels": {"team": "platform"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "po", "operator": "Exists"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "server"}},
                        },
                    }
                ]
            }
        },
        "managedRunners": {
            "replicas": 4,
            "tags": ["gpu", "docker"],
            "secret": EXPLICIT_SECRET,
            "workDirSize": "10Gi",
            "affinity": {"nodeAffinity": {}},
        },
    },
)
#: (id, values, kinds rendered).
VALUE_SETS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("defaults", DEFAULTS, [*SERVER_KINDS, "PersistentVolumeClaim", *RUNNER_KINDS]),
    (
        "managed-runners-disabled",
        merged({"managedRunners": {"enabled": False}}),
        [*SERVER_KINDS, "PersistentVolumeClaim"],
    ),
    (
        "zero-runners",
        merged({"managedRunners": {"replicas": 0}}),
        [*SERVER_KINDS, "PersistentVolumeClaim", *RUNNER_KINDS],
    ),
    (
        "custom-tags",
        merged({"managedRunners": {"tags": ["gpu", "kubernetes"]}}),
        [*SERVER_KINDS, "PersistentVolumeClaim", *RUNNER_KINDS],
    ),
    (
        "explicit-secret",
        merged({"managedRunners": {"secret": EXPLICIT_SECRET}}),
        [*SERVER_KINDS, "PersistentVolumeClaim", *RUNNER_KINDS],
    ),
    ("existing-database-secret", merged(POSTGRES), [*SERVER_KINDS, "PersistentVolumeClaim", *RUNNER_KINDS]),
    (
        "existing-key-token-claim-no-service-account",
        merged(
            {
                "encryptionKey": {"existingSecret": "server-key"},
                "bootstrapToken": {"existingSecret": "admin"},
                "persistence": {"existingClaim": "po-data"},
                "serviceAccount": {"create": False},
            }
        ),
        ["Deployment", "Service", "Secret", *RUNNER_KINDS],
    ),
    ("everything-set", EVERYTHING, [*SERVER_KINDS, *RUNNER_KINDS]),
    (
        "tls-with-client-ca",
        merged(TLS, {"tls": {"clientCa": {"secretName": "po-clients"}, "clientAuth": "optional"}}),
        [*SERVER_KINDS, "PersistentVolumeClaim", *RUNNER_KINDS],
    ),
    (
        "service-monitor",
        merged(SERVICE_MONITOR),
        [*SERVER_KINDS, "PersistentVolumeClaim", *RUNNER_KINDS, "ServiceMonitor"],
    ),
    (
        "everything-set-runners-off",
        merged(EVERYTHING, {"managedRunners": {"enabled": False}, "fullnameOverride": "cell"}),
        SERVER_KINDS,
    ),
]


@pytest.mark.parametrize(
    ("values", "kinds"), [(v, k) for _, v, k in VALUE_SETS], ids=[i for i, _, _ in VALUE_SETS]
)
def test_value_sets__every_manifest_passes_the_strict_schemas(
    chart: Any, values: dict[str, Any], kinds: list[str]
) -> None:
    """Each value set renders the objects its switches ask for, each valid by ``kubernetes-validate
    --strict`` for the newest Kubernetes and 1.30 (every problem of every manifest reported at once)."""
    rendered = manifests(chart.render(values, name=RELEASE, namespace=NAMESPACE))

    assert sorted(m["kind"] for m in rendered) == sorted(kinds)
    problems = [
        f"{m['kind']} {m['metadata']['name']}: {problem}"
        for m in rendered
        for problem in manifest_problems(m)
    ]
    assert problems == []
    names = [(m["kind"], m["metadata"]["name"]) for m in rendered]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize(
    "values",
    [
        DEFAULTS,
        merged({"managedRunners": {"enabled": False}}),
        merged({"managedRunners": {"replicas": 0}}),
        merged({"managedRunners": {"tags": ["gpu", "kubernetes"]}}),
        merged({"managedRunners": {"secret": EXPLICIT_SECRET}}),
        merged(POSTGRES),
        EVERYTHING,
        merged(SERVICE_MONITOR),
    ],
    ids=[
        "defaults",
        "disabled",
        "zero-runners",
        "custom-tags",
        "explicit-secret",
        "database-secret",
        "everything",
        "service-monitor",
    ],
)
def test_helm_lint__strict_passes(helm: ModuleType, values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert report["total_charts_linted"] == 1


def test_chart__values_documented_in_readme() -> None:
    """Every leaf of values.yaml is named in the README's table (Kubernetes objects as a whole)."""
    objects = {"resources", "podSecurityContext", "securityContext", "managedRunners.resources"}
    assert undocumented_values(CHART, objects) == []


def test_docs__the_install_commands_give_a_server_on_that_database_and_its_admin_token(chart: Any) -> None:
    """docs/operate/install.md's three commands, read as kubectl and Helm read them: the Secret the first
    makes is the one the installed server takes PO_DATABASE_URL from (name and key), the install's values
    render (valid manifests) into that namespace, and the Secret the last reads holds the token."""
    create_secret, install, read_token = commands(docs_example("operate/platform-chart"))
    kubectl = shlex.split(create_secret)
    assert kubectl[:6] == ["kubectl", "-n", "po", "create", "secret", "generic"]
    secret_name, literal = kubectl[6], kubectl[7].removeprefix("--from-literal=")
    secret_key = literal.partition("=")[0]
    helm_words = shlex.split(install)
    assert helm_words[:4] == ["helm", "install", "po", "charts/platform-orchestrator"]
    namespace = helm_words[helm_words.index("-n") + 1]
    values: dict[str, Any] = {}
    for flag, assignment in zip(helm_words[4::2], helm_words[5::2], strict=True):
        if flag == "--set":
            path, _, value = assignment.partition("=")
            *parents, leaf = path.split(".")
            place = values
            for name in parents:
                place = place.setdefault(name, {})
            place[leaf] = value
    reading = shlex.split(read_token.split("|")[0])

    rendered = manifests(chart.render(values, name=helm_words[2], namespace=namespace))

    assert [] == [problem for m in rendered for problem in manifest_problems(m)]
    env = env_of(container(rendered, "Deployment"))
    assert {"name": secret_name, "key": secret_key} == secret_ref(env, "PO_DATABASE_URL")
    assert "https://po.example.com" == env["PO_PUBLIC_URL"]["value"]
    assert reading[:5] == ["kubectl", "-n", namespace, "get", "secret"]
    token = one(rendered, "Secret", reading[5])
    assert namespace == token["metadata"]["namespace"]
    assert reading[-1] == "jsonpath={.data.token}" and token["data"]["token"]
