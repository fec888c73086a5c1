"""The agent's Helm chart (``charts/platform-orchestrator-agent``), rendered offline with helm-python-sdk.

Every rendered manifest is checked with ``kubernetes-validate --strict`` (the upstream OpenAPI schemas,
unknown fields refused) for the newest Kubernetes it ships and for 1.30. No cluster is involved: these
tests prove the manifests are well-formed and say what we mean, not that a real API server accepts them.

helm-python-sdk missing: the tests skip, or fail when ``CI`` or ``PO_TEST_REQUIRE_TOOLS`` is set.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from orchestrator.agent.metrics import parse_address
from orchestrator.agent.settings import AgentSettings
from orchestrator.launchers.images import DEFAULT_RUNNER_IMAGE
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

CHART = Path(__file__).resolve().parents[2] / "charts" / "platform-orchestrator-agent"
KUBERNETES_VERSIONS = (latest_version(), "1.30.0")
RELEASE = "agent"
NAMESPACE = "po-agent"
PRIVATE_KEY = (
    "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIKey0nlyF0rTestsN0tARealKeyAtAll0123456789\n"
    "-----END PRIVATE KEY-----\n"
)
BASE_VALUES: dict[str, Any] = {
    "platformOrchestrator": {"orgId": "acme", "runnerId": "cluster-agent"},
    "gateway": {"url": "https://orchestrator.example.com", "privateKey": PRIVATE_KEY},
}


@pytest.fixture(scope="module")
def helm() -> ModuleType:
    return import_helm()


@pytest.fixture(scope="module")
def chart(helm: ModuleType) -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def merged(*overrides: dict[str, Any]) -> dict[str, Any]:
    return merged_values(BASE_VALUES, *overrides)


def render(chart: Any, values: dict[str, Any], namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Every manifest the chart renders for ``values``, each validated strictly (a ServiceMonitor, a custom
    resource kubernetes-validate has no schema for, by the Prometheus Operator's fields)."""
    rendered = manifests(chart.render(values, name=RELEASE, namespace=namespace))
    assert rendered
    for manifest in rendered:
        if manifest["kind"] == "ServiceMonitor":
            assert [] == manifest_problems(manifest)
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(manifest, version, strict=True)
    return rendered


def agent_container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    result: dict[str, Any] = container
    return result


def volumes_by_mount_path(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in agent_container(manifests)["volumeMounts"]}


def rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs."""
    result: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                result.setdefault((group, resource), set()).update(rule["verbs"])
    return result


def assert_key_never_in_plain_text(manifests: list[dict[str, Any]]) -> None:
    """The private key is only ever base64 data of a Secret: not a ConfigMap, an env value, a label."""
    encoded = base64.b64encode(PRIVATE_KEY.encode()).decode()
    for manifest in manifests:
        text = yaml.safe_dump(manifest)
        assert "PRIVATE KEY" not in text, manifest["kind"]
        if manifest["kind"] != "Secret":
            assert encoded not in text, manifest["kind"]
    assert not by_kind(manifests, "ConfigMap")
    for entry in agent_container(manifests)["env"]:
        if entry["name"] == "PRIVATE_KEY":
            assert "value" not in entry
    assert not agent_container(manifests).get("envFrom")


# -- default values ----------------------------------------------------------------------------------


def test_default_values__render_valid_manifests(chart: Any) -> None:
    manifests = render(chart, BASE_VALUES)
    kinds = sorted(m["kind"] for m in manifests)
    assert kinds == sorted(
        [
            "Deployment",
            "Secret",
            "ServiceAccount",
            "ServiceAccount",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
        ]
    )
    assert all(m["metadata"]["namespace"] == NAMESPACE for m in manifests)


def test_deployment__runs_po_runner_remote_with_the_agent_environment(chart: Any) -> None:
    manifests = render(chart, BASE_VALUES)
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    container = agent_container(manifests)
    assert container["args"] == ["remote"]
    assert "command" not in container  # the image's entrypoint is po-runner
    # Our runner image, the Jobs' default too (launchers/images.py), tagged with the chart's appVersion.
    assert container["image"] == DEFAULT_RUNNER_IMAGE
    env = env_of(container)
    assert env["ORG_ID"]["value"] == "acme"
    assert env["RUNNER_ID"]["value"] == "cluster-agent"
    assert env["RUNNER_GATEWAY_URL"]["value"] == "https://orchestrator.example.com"
    assert env["LOG_LEVEL"]["value"] == "info"
    assert env["PO_LOG_FORMAT"]["value"] == "json"
    assert env["AGENT_JOB_NAMESPACES"]["value"] == NAMESPACE
    assert not {"RUNNER_GATEWAY_CA_FILE", "RUNNER_GATEWAY_CLIENT_CERT_FILE"} & set(env)
    pod = deployment["spec"]["template"]["spec"]
    assert (
        pod["serviceAccountName"]
        == one(manifests, "ServiceAccount", f"{RELEASE}-platform-orchestrator-agent")["metadata"]["name"]
    )


def test_deployment__private_key_from_the_charts_secret(chart: Any) -> None:
    manifests = render(chart, BASE_VALUES)
    secret = one(manifests, "Secret")
    assert secret["metadata"]["name"] == f"{RELEASE}-platform-orchestrator-agent-private-key"
    assert "stringData" not in secret
    assert base64.b64decode(secret["data"]["private-key.pem"]).decode() == PRIVATE_KEY
    reference = env_of(agent_container(manifests))["PRIVATE_KEY"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": secret["metadata"]["name"], "key": "private-key.pem"}
    assert_key_never_in_plain_text(manifests)


def test_deployment__secure_defaults(chart: Any) -> None:
    manifests = render(chart, BASE_VALUES)
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65534
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = agent_container(manifests)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert volumes_by_mount_path(manifests)["/tmp"]["emptyDir"] == {}
    resources = agent_container(manifests)["resources"]
    assert resources["requests"]["memory"] and resources["limits"]["memory"]


def test_agent_role__jobs_pods_events_and_token_secrets(chart: Any) -> None:
    manifests = render(chart, BASE_VALUES)
    name = f"{RELEASE}-platform-orchestrator-agent"
    role = one(manifests, "Role", name)
    assert rules(role) == {
        ("batch", "jobs"): {"create", "get", "list", "delete"},
        ("", "pods"): {"get", "list"},
        ("", "pods/log"): {"get", "list"},
        ("", "events"): {"list"},
        ("", "secrets"): {"create", "get", "update"},
    }
    binding = one(manifests, "RoleBinding", name)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]


def test_jobs_rbac__state_backend_secrets_and_leases(chart: Any) -> None:
    manifests = render(chart, BASE_VALUES)
    name = "kubernetes-runner-job"
    assert one(manifests, "ServiceAccount", name)["metadata"]["namespace"] == NAMESPACE
    assert rules(one(manifests, "Role", name)) == {
        ("", "secrets"): {"create", "get", "list", "update", "delete"},
        ("coordination.k8s.io", "leases"): {"create", "get", "update", "delete"},
    }
    binding = one(manifests, "RoleBinding", name)
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}]


# -- variants ----------------------------------------------------------------------------------------


def test_existing_secret__no_secret_rendered_key_from_it(chart: Any) -> None:
    values = merged(
        {"gateway": {"privateKey": "", "privateKeyExistingSecret": "agent-key", "privateKeyKey": "key.pem"}}
    )
    manifests = render(chart, values)
    assert not by_kind(manifests, "Secret")
    reference = env_of(agent_container(manifests))["PRIVATE_KEY"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": "agent-key", "key": "key.pem"}
    annotations = one(manifests, "Deployment")["spec"]["template"]["metadata"].get("annotations") or {}
    assert "checksum/private-key" not in annotations


def test_existing_secret__wins_over_an_inline_key(chart: Any) -> None:
    manifests = render(chart, merged({"gateway": {"privateKeyExistingSecret": "agent-key"}}))
    assert not by_kind(manifests, "Secret")
    assert_key_never_in_plain_text(manifests)
    reference = env_of(agent_container(manifests))["PRIVATE_KEY"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": "agent-key", "key": "private-key.pem"}


def test_ca_and_client_certificate__mounted_from_their_secrets(chart: Any) -> None:
    values = merged(
        {"gateway": {"caExistingSecret": "gateway-ca", "clientCertificateExistingSecret": "agent-tls"}}
    )
    manifests = render(chart, values)
    env = env_of(agent_container(manifests))
    assert env["RUNNER_GATEWAY_CA_FILE"]["value"] == "/etc/po-agent/ca/ca.crt"
    assert env["RUNNER_GATEWAY_CLIENT_CERT_FILE"]["value"] == "/etc/po-agent/client/tls.crt"
    assert env["RUNNER_GATEWAY_CLIENT_KEY_FILE"]["value"] == "/etc/po-agent/client/tls.key"
    volumes = volumes_by_mount_path(manifests)
    assert volumes["/etc/po-agent/ca"]["secret"]["secretName"] == "gateway-ca"
    assert [i["key"] for i in volumes["/etc/po-agent/ca"]["secret"]["items"]] == ["ca.crt"]
    client = volumes["/etc/po-agent/client"]["secret"]
    assert client["secretName"] == "agent-tls"
    assert [i["key"] for i in client["items"]] == ["tls.crt", "tls.key"]
    mounts = {m["mountPath"]: m for m in agent_container(manifests)["volumeMounts"]}
    assert mounts["/etc/po-agent/ca"]["readOnly"] and mounts["/etc/po-agent/client"]["readOnly"]
    assert_key_never_in_plain_text(manifests)


def test_ca_only__custom_key(chart: Any) -> None:
    manifests = render(chart, merged({"gateway": {"caExistingSecret": "gateway-ca", "caKey": "bundle.pem"}}))
    env = env_of(agent_container(manifests))
    assert env["RUNNER_GATEWAY_CA_FILE"]["value"] == "/etc/po-agent/ca/bundle.pem"
    assert "RUNNER_GATEWAY_CLIENT_CERT_FILE" not in env
    assert "/etc/po-agent/client" not in volumes_by_mount_path(manifests)


def test_ca_from_a_config_map__same_file_not_both(helm: ModuleType, chart: Any) -> None:
    manifests = render(
        chart, merged({"gateway": {"caExistingConfigMap": "trust-bundle", "caKey": "root.pem"}})
    )
    env = env_of(agent_container(manifests))
    assert env["RUNNER_GATEWAY_CA_FILE"]["value"] == "/etc/po-agent/ca/root.pem"
    volume = volumes_by_mount_path(manifests)["/etc/po-agent/ca"]
    assert volume["configMap"] == {"name": "trust-bundle", "items": [{"key": "root.pem", "path": "root.pem"}]}
    assert "secret" not in volume
    with pytest.raises(helm.HelmError, match="not both"):
        chart.render(
            merged({"gateway": {"caExistingConfigMap": "trust-bundle", "caExistingSecret": "gateway-ca"}}),
            name=RELEASE,
            namespace=NAMESPACE,
        )


def test_jobs_rbac_off__only_the_agent_resources(chart: Any) -> None:
    manifests = render(chart, merged({"jobsRbac": {"create": False}}))
    names = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    assert not any(name == "kubernetes-runner-job" for _, name in names)
    assert len(by_kind(manifests, "Role")) == 1


def test_jobs_namespace__rbac_there_agent_bound_across_namespaces(chart: Any) -> None:
    manifests = render(chart, merged({"jobsRbac": {"namespace": "runner-jobs"}}))
    for kind in ("Role", "RoleBinding"):
        assert {m["metadata"]["namespace"] for m in by_kind(manifests, kind)} == {"runner-jobs"}
    assert one(manifests, "ServiceAccount", "kubernetes-runner-job")["metadata"]["namespace"] == "runner-jobs"
    agent_binding = one(manifests, "RoleBinding", f"{RELEASE}-platform-orchestrator-agent")
    assert agent_binding["subjects"][0]["namespace"] == NAMESPACE
    assert one(manifests, "Deployment")["metadata"]["namespace"] == NAMESPACE
    # A restarted agent looks for its pending Jobs where its Role lets it list them.
    assert env_of(agent_container(manifests))["AGENT_JOB_NAMESPACES"]["value"] == "runner-jobs"


def test_rbac_and_service_account_off__existing_service_account(chart: Any) -> None:
    values = merged(
        {
            "rbac": {"create": False},
            "jobsRbac": {"create": False},
            "serviceAccount": {"create": False, "name": "agent-sa"},
        }
    )
    manifests = render(chart, values)
    assert sorted(m["kind"] for m in manifests) == ["Deployment", "Secret"]
    assert one(manifests, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "agent-sa"


def test_overrides__replicas_image_log_level_extra_env_scheduling(chart: Any) -> None:
    values = merged(
        {
            "replicaCount": 3,
            "image": {"repository": "registry.example.com/po-runner", "tag": "1.2.3", "pullPolicy": "Always"},
            "imagePullSecrets": [{"name": "registry"}],
            "platformOrchestrator": {
                "logLevel": "debug",
                "logFormat": "console",
                "extraEnvVars": [
                    {"name": "AGENT_POLL_TIMEOUT_SECONDS", "value": "60"},
                    {"name": "HTTPS_PROXY", "valueFrom": {"secretKeyRef": {"name": "proxy", "key": "url"}}},
                ],
            },
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            "podAnnotations": {"example.com/team": "platform"},
            "podLabels": {"team": "platform"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "po", "effect": "NoSchedule"}],
            "serviceAccount": {"annotations": {"example.com/role": "agent"}},
        }
    )
    manifests = render(chart, values)
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"]["example.com/team"] == "platform"
    assert template["metadata"]["labels"]["team"] == "platform"
    pod = template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"][0]["key"] == "dedicated"
    container = agent_container(manifests)
    assert container["image"] == "registry.example.com/po-runner:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    # Helm merges maps: the default memory limit stays.
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"memory": "256Mi"},
    }
    env = env_of(container)
    assert env["LOG_LEVEL"]["value"] == "debug"
    assert env["PO_LOG_FORMAT"]["value"] == "console"
    assert env["AGENT_POLL_TIMEOUT_SECONDS"]["value"] == "60"
    assert env["HTTPS_PROXY"]["valueFrom"]["secretKeyRef"]["name"] == "proxy"
    assert [e["name"] for e in container["env"]][:7] == [
        "ORG_ID",
        "RUNNER_ID",
        "RUNNER_GATEWAY_URL",
        "LOG_LEVEL",
        "PO_LOG_FORMAT",
        "AGENT_JOB_NAMESPACES",
        "PRIVATE_KEY",
    ]
    sa = one(manifests, "ServiceAccount", f"{RELEASE}-platform-orchestrator-agent")
    assert sa["metadata"]["annotations"] == {"example.com/role": "agent"}


def test_private_key_change__rolls_the_deployment(chart: Any) -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = one(render(chart, values), "Deployment")
        result: str = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/private-key"]
        return result

    other = PRIVATE_KEY.replace("Test", "Other")
    assert checksum(BASE_VALUES) != checksum(merged({"gateway": {"privateKey": other}}))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"platformOrchestrator": {"orgId": ""}}, "platformOrchestrator.orgId is required"),
        ({"platformOrchestrator": {"runnerId": ""}}, "platformOrchestrator.runnerId is required"),
        ({"gateway": {"url": ""}}, "gateway.url is required"),
        ({"gateway": {"privateKey": ""}}, "gateway.privateKeyExistingSecret"),
        ({"serviceAccount": {"create": False}}, "serviceAccount.name is required"),
        (
            {"platformOrchestrator": {"logFormat": "text"}},
            'platformOrchestrator.logFormat must be json or console, not "text"',
        ),
    ],
)
def test_required_values__refused(
    helm: ModuleType, chart: Any, override: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmError, match=message.replace(".", r"\.")):
        chart.render(merged(override), name=RELEASE, namespace=NAMESPACE)


# -- metrics -----------------------------------------------------------------------------------------

METRICS = {"metrics": {"enabled": True, "port": 9300}}
SERVICE_MONITOR = {
    "metrics": {
        "enabled": True,
        "serviceMonitor": {"enabled": True, "interval": "1m", "labels": {"release": "p"}},
    }
}
SCRAPE_ANNOTATIONS = {"prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path"}


def test_metrics__off_by_default(chart: Any) -> None:
    rendered = render(chart, BASE_VALUES)
    container = agent_container(rendered)
    template = one(rendered, "Deployment")["spec"]["template"]["metadata"]
    assert "AGENT_METRICS_ADDR" not in env_of(container)
    assert "ports" not in container
    assert not SCRAPE_ANNOTATIONS & set(template.get("annotations", {}))
    assert [] == by_kind(rendered, "ServiceMonitor")


def test_metrics__endpoint_port_and_annotations_the_agent_accepts(chart: Any) -> None:
    rendered = render(chart, merged(METRICS))
    container = agent_container(rendered)
    annotations = one(rendered, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    address = env_of(container)["AGENT_METRICS_ADDR"]["value"]
    assert [{"name": "metrics", "containerPort": 9300, "protocol": "TCP"}] == container["ports"]
    assert {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9300",
        "prometheus.io/path": "/metrics",
    } == {k: v for k, v in annotations.items() if k in SCRAPE_ANNOTATIONS}
    # The agent's own settings take the address the chart sets, and listen on the annotated port.
    settings = AgentSettings(
        org_id="acme",
        runner_id="cluster-agent",
        private_key=PRIVATE_KEY,
        runner_gateway_url="https://orchestrator.example.com",
        agent_metrics_addr=address,
    )
    assert ("0.0.0.0", 9300) == parse_address(settings.agent_metrics_addr)
    assert [] == by_kind(rendered, "ServiceMonitor")


def test_service_monitor__a_metrics_service_of_the_agent_pods_and_its_monitor(chart: Any) -> None:
    rendered = render(chart, merged(SERVICE_MONITOR))
    monitor = one(rendered, "ServiceMonitor")
    service = one(rendered, "Service")
    pod_labels = one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}] == service["spec"][
        "ports"
    ]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [{"port": "metrics", "path": "/metrics", "interval": "1m"}] == monitor["spec"]["endpoints"]
    assert [NAMESPACE] == monitor["spec"]["namespaceSelector"]["matchNames"]
    assert "p" == monitor["metadata"]["labels"]["release"]
    assert "0.0.0.0:9090" == env_of(agent_container(rendered))["AGENT_METRICS_ADDR"]["value"]


def test_service_monitor__refused_without_metrics(helm: ModuleType, chart: Any) -> None:
    values = merged({"metrics": {"serviceMonitor": {"enabled": True}}})
    with pytest.raises(helm.HelmError, match=r"metrics\.serviceMonitor\.enabled needs metrics\.enabled"):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


# -- strict schemas, every value set -----------------------------------------------------------------

#: What each switch renders besides the Deployment.
AGENT_RBAC = ["Role", "RoleBinding"]
JOBS_RBAC = ["ServiceAccount", "Role", "RoleBinding"]
OVERRIDES: dict[str, Any] = {
    "replicaCount": 3,
    "image": {"repository": "registry.example.com/po-runner", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "platformOrchestrator": {
        "logLevel": "debug",
        "extraEnvVars": [
            {"name": "AGENT_POLL_TIMEOUT_SECONDS", "value": "60"},
            {"name": "HTTPS_PROXY", "valueFrom": {"secretKeyRef": {"name": "proxy", "key": "url"}}},
        ],
    },
    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
    "podAnnotations": {"example.com/team": "platform"},
    "podLabels": {"team": "platform"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "po", "effect": "NoSchedule"}],
    "serviceAccount": {"annotations": {"example.com/role": "agent"}},
}
EXISTING_KEY = {
    "gateway": {"privateKey": "", "privateKeyExistingSecret": "agent-key", "privateKeyKey": "key.pem"}
}
CA_AND_MTLS = {"gateway": {"caExistingSecret": "gateway-ca", "clientCertificateExistingSecret": "agent-tls"}}
NOTHING_CREATED = {
    "rbac": {"create": False},
    "jobsRbac": {"create": False},
    "serviceAccount": {"create": False, "name": "agent-sa"},
}
#: Every value set the tests above render, and combinations of them: (id, values, kinds rendered).
VALUE_SETS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("defaults", BASE_VALUES, ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC]),
    ("existing-secret", merged(EXISTING_KEY), ["Deployment", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC]),
    (
        "existing-secret-wins-over-inline-key",
        merged({"gateway": {"privateKeyExistingSecret": "agent-key"}}),
        ["Deployment", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC],
    ),
    ("ca-and-mtls", merged(CA_AND_MTLS), ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC]),
    (
        "ca-only-custom-key",
        merged({"gateway": {"caExistingSecret": "gateway-ca", "caKey": "bundle.pem"}}),
        ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC],
    ),
    (
        "ca-from-config-map",
        merged({"gateway": {"caExistingConfigMap": "trust-bundle"}}),
        ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC],
    ),
    (
        "jobs-rbac-off",
        merged({"jobsRbac": {"create": False}}),
        ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC],
    ),
    (
        "jobs-namespace",
        merged({"jobsRbac": {"namespace": "runner-jobs"}}),
        ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC],
    ),
    ("nothing-created", merged(NOTHING_CREATED), ["Deployment", "Secret"]),
    ("metrics", merged(METRICS), ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC]),
    (
        "service-monitor",
        merged(SERVICE_MONITOR),
        ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC, "Service", "ServiceMonitor"],
    ),
    ("overrides", merged(OVERRIDES), ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC]),
    (
        "other-private-key",
        merged({"gateway": {"privateKey": PRIVATE_KEY.replace("Test", "Other")}}),
        ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC],
    ),
    # Combinations.
    (
        "everything-set",
        merged(OVERRIDES, EXISTING_KEY, CA_AND_MTLS, {"jobsRbac": {"namespace": "runner-jobs"}}),
        ["Deployment", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC],
    ),
    (
        "nothing-created-existing-key-and-ca",
        merged(NOTHING_CREATED, EXISTING_KEY, {"gateway": {"caExistingSecret": "gateway-ca"}}),
        ["Deployment"],
    ),
    (
        "overrides-existing-service-account-jobs-elsewhere",
        merged(
            OVERRIDES,
            {
                "serviceAccount": {"create": False, "name": "agent-sa"},
                "jobsRbac": {"namespace": "runner-jobs", "serviceAccountName": "runner"},
            },
        ),
        ["Deployment", "Secret", *AGENT_RBAC, *JOBS_RBAC],
    ),
    (
        "names-overridden-mtls",
        merged({"nameOverride": "agent", "fullnameOverride": "po-agent-prod"}, CA_AND_MTLS),
        ["Deployment", "Secret", "ServiceAccount", *AGENT_RBAC, *JOBS_RBAC],
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
    names = [(m["kind"], m["metadata"].get("namespace"), m["metadata"]["name"]) for m in rendered]
    assert len(names) == len(set(names)), names


# -- helm lint ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        BASE_VALUES,
        merged({"gateway": {"privateKey": "", "privateKeyExistingSecret": "agent-key"}}),
        merged({"gateway": {"caExistingSecret": "ca", "clientCertificateExistingSecret": "tls"}}),
        merged({"jobsRbac": {"create": False}}),
        merged(SERVICE_MONITOR),
    ],
    ids=["defaults", "existing-secret", "ca-mtls", "jobs-rbac-off", "service-monitor"],
)
def test_helm_lint__strict_passes(helm: ModuleType, values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert report["total_charts_linted"] == 1


def test_chart__values_documented_in_readme() -> None:
    """Every leaf of values.yaml is named in the README's table (Kubernetes objects as a whole)."""
    assert undocumented_values(CHART, {"resources", "podSecurityContext", "securityContext"}) == []
