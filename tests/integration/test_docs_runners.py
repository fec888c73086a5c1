"""The examples of docs/runners/ applied: each runner configuration is created through `octl` as printed
(placeholders the page marks as such filled in), the agent's install commands run against a server and the
agent chart, the Kubernetes RBAC is valid Kubernetes, the EKS trust policy admits the token the orchestrator
mints for that runner (and no other), and the read-only root file system's pod template gives a valid Job
that mounts what the page says."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from orchestrator.domain.runner_types import K8sRunnerJobConfig
from orchestrator.launchers import aws, kubernetes_job
from orchestrator.launchers.base import LaunchTarget
from orchestrator.settings import ServerSettings
from tests.support.docs import ROOT, Shell, commands, docs_example, substitute
from tests.support.helm_charts import env_of, import_helm, manifest_problems, manifests, merged, one
from tests.support.kube_launcher import IMAGE, make_spec
from tests.support.kube_schema import assert_valid
from tests.support.octl import ORG, Octl, org_admin_token, serve
from tests.support.orgs import BOOTSTRAP_TOKEN

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def platform_octl(settings: ServerSettings, tmp_path: Path) -> Iterator[Octl]:
    with serve(settings) as base_url:
        org_admin_token(base_url)
        yield Octl(base_url=base_url, token=BOOTSTRAP_TOKEN, config_path=tmp_path / "octl.yaml")


def ssh_keys() -> tuple[str, str]:
    """A real Ed25519 pair: (OpenSSH private key, OpenSSH public key)."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public.decode()


def vm_ssh_runner() -> str:
    """The page's `vm` over SSH runner with its placeholders (`...`) replaced by real keys and a value."""
    private, public = ssh_keys()
    indented = "".join(f"      {line}\n" for line in private.strip().splitlines()[1:])
    return substitute(
        docs_example("runners/vm-ssh-runner"),
        {
            "ssh-ed25519 AAAAC3Nza...": public,
            "      -----BEGIN OPENSSH PRIVATE KEY-----\n      ...\n": f"      {private.splitlines()[0]}\n"
            + indented,
            "AWS_SECRET_ACCESS_KEY: ...": "AWS_SECRET_ACCESS_KEY: not-a-real-key",
        },
    )


RUNNERS = {
    "kubernetes-gke": lambda: docs_example("runners/gke-runner"),
    "kubernetes-eks": lambda: docs_example("runners/eks-runner"),
    "kubernetes-aks": lambda: docs_example("runners/aks-runner"),
    "serverless-ecs": lambda: docs_example("runners/ecs-runner"),
    "vm": vm_ssh_runner,
}


@pytest.mark.parametrize("kind", sorted(RUNNERS))
def test_runner_page__its_configuration_is_created_through_octl(
    kind: str, platform_octl: Octl, tmp_path: Path
) -> None:
    text = RUNNERS[kind]()
    path = tmp_path / "runner.yaml"
    path.write_text(text)

    created = platform_octl("create", "runner", "from-the-docs", f"--set-yaml=@{path}", "-o", "json")

    assert 0 == created.exit_code, created.output
    runner = json.loads(created.stdout)
    assert kind == runner["runner_configuration"]["type"]
    shown = yaml.safe_load(text)
    assert shown["runner_configuration"].keys() <= runner["runner_configuration"].keys()
    if kind == "vm":
        assert "SECRET" == runner["runner_configuration"]["connection"]["private_key"]


def test_agent_page__the_install_commands_create_the_runner_and_install_the_chart(
    platform_octl: Octl, tmp_path: Path
) -> None:
    """The octl lines run in a shell against a server, the state storage added as the comment says; the
    `helm install` line's flags render the agent chart (helm-python-sdk: `helm template` of the same
    values, no cluster), whose agent gets the organization, the runner, the gateway and the key."""
    key_line, runner_line, helm_line = commands(docs_example("runners/agent-install"))
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PO_API_URL": platform_octl.base_url,
        "PO_AUTH_TOKEN": platform_octl.token,
        "PO_ORG_ID": ORG,
        "OCTL_CONFIG": str(tmp_path / "octl.yaml"),
        "HOME": str(tmp_path),
    }
    shell = Shell(cwd=tmp_path, env=env, state=tmp_path)
    shell.run(key_line)
    with (tmp_path / "runner.yaml").open("a") as runner_yaml:
        runner_yaml.write("state_storage_configuration: {type: kubernetes, namespace: runners}\n")
    shell.run(runner_line)
    runner = json.loads(shell.run("octl get runner my-agent-runner -o json").stdout)
    assert "kubernetes-agent" == runner["runner_configuration"]["type"]

    words = shlex.split(helm_line)
    assert words[:4] == ["helm", "install", "po-agent", "charts/platform-orchestrator-agent"]
    values = helm_values(words[4:], tmp_path)
    helm = import_helm()
    with helm.Chart.load(ROOT / "charts" / "platform-orchestrator-agent") as chart:
        base = yaml.safe_load((ROOT / "charts" / "platform-orchestrator-agent" / "values.yaml").read_text())
        rendered = manifests(chart.render(merged(base, values), name="po-agent", namespace="default"))
    for manifest in rendered:
        assert [] == manifest_problems(manifest), manifest["kind"]
    agent = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    variables = env_of(agent)
    assert variables["ORG_ID"]["value"] == "my-org"
    assert variables["RUNNER_ID"]["value"] == "my-agent-runner"
    assert variables["RUNNER_GATEWAY_URL"]["value"] == "https://po.example.com"
    secret = next(m for m in rendered if m["kind"] == "Secret")
    assert (tmp_path / "agent.pem").read_text().strip() in json.dumps(secret) or secret.get("data")


def helm_values(flags: list[str], cwd: Path) -> dict[str, Any]:
    """The values Helm makes of ``--set a.b=c`` and ``--set-file a.b=path`` flags (strings as given)."""
    values: dict[str, Any] = {}
    pairs = iter(flags)
    for flag in pairs:
        assignment = next(pairs)
        path, _, value = assignment.partition("=")
        if flag == "--set-file":
            value = (cwd / value).read_text()
        elif flag == "-n":
            continue
        else:
            assert flag == "--set", flag
        *parents, leaf = path.split(".")
        place = values
        for name in parents:
            place = place.setdefault(name, {})
        place[leaf] = value
    return values


def test_kubernetes_gke_page__the_rbac_is_valid_and_holds_the_kubernetes_pages_rules() -> None:
    documents = list(yaml.safe_load_all(docs_example("runners/gke-rbac")))
    for document in documents:
        assert_valid(document)
    role, binding = documents
    granted = {(verb, res) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    needed = yaml.safe_load(docs_example("runners/kubernetes-role-rules"))["rules"]
    wanted = {(verb, res) for rule in needed for res in rule["resources"] for verb in rule["verbs"]}
    assert wanted | {("delete", "jobs")} == granted
    gke = yaml.safe_load(docs_example("runners/gke-runner"))["runner_configuration"]
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == gke["job"]["namespace"]
    assert [s["name"] for s in binding["subjects"]] == [gke["cluster"]["auth"]["gcp_service_account"]]


def test_kubernetes_eks_page__the_trust_policy_admits_the_runners_token_only() -> None:
    """The policy's conditions, evaluated as IAM does (StringEquals on `<issuer host>:aud` and `:sub`),
    against the claims of the token the orchestrator asks for when it launches the runner the policy names
    (`acme+prod-eks`: the launch target's subject, STS's audience) and another runner's; the provider is
    the issuer's (PO_PUBLIC_URL's) host."""
    policy = json.loads(docs_example("runners/eks-trust-policy"))
    (statement,) = policy["Statement"]
    host = statement["Principal"]["Federated"].split(":oidc-provider/", 1)[1]
    assert statement["Action"] == "sts:AssumeRoleWithWebIdentity" and statement["Effect"] == "Allow"

    def admits(org: str, runner: str) -> bool:
        target = LaunchTarget(org_id=org, runner_id=runner, runner_type="kubernetes-eks", configuration={})
        claims = {"iss": f"https://{host}", "sub": target.subject, "aud": aws.AUDIENCE}
        assert urlsplit(claims["iss"]).netloc == host
        conditions = statement["Condition"]["StringEquals"]
        return all(claims[key.rsplit(":", 1)[1]] == value for key, value in conditions.items())

    assert admits("acme", "prod-eks")
    assert not admits("acme", "staging-eks")
    assert not admits("globex", "prod-eks")


def test_images_page__the_read_only_pod_template_gives_a_valid_job_with_writable_directories(
    tmp_path: Path,
) -> None:
    shown = yaml.safe_load(docs_example("runners/images-read-only"))
    spec = make_spec(tmp_path)
    job = {**spec.runner_configuration["job"], **shown["job"]}
    spec = spec.model_copy(update={"runner_configuration": {**spec.runner_configuration, "job": job}})

    manifest = kubernetes_job.render_job_manifest(
        spec,
        K8sRunnerJobConfig.model_validate(job),
        IMAGE,
        token_secret=kubernetes_job.token_secret_name(spec),
    )

    assert_valid(manifest)
    (main,) = [c for c in manifest["spec"]["template"]["spec"]["containers"] if c["name"] == "main"]
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    mounted = {m["mountPath"] for m in main["volumeMounts"]}
    assert {"/tmp", "/home/runner", "/opt/runner/tofu"} <= mounted
