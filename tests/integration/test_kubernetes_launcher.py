"""KubernetesLauncher against the stand-in API server (tests/support/kube_api.py), over TLS with the
cluster CA and a client certificate as in seed 001, unless a test says otherwise.

The stand-in is not Kubernetes: it implements the Jobs, Pods, Events and Secrets endpoints the launcher
uses with their real semantics, and a kubelet that runs the pod's container as a local process. It listens
on 127.0.0.1, so these launchers allow loopback (and plain http) explicitly (``STAND_IN_EGRESS``); the
server's default policy refuses both (tests/integration/test_runner_egress.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from orchestrator.launchers.base import LaunchError, RunState, RunStatus
from orchestrator.launchers.egress import EgressPolicy
from orchestrator.launchers.kubernetes import ClusterAccess, KubernetesLauncher
from tests.support import kube_protobuf
from tests.support.docs import docs_example
from tests.support.kube_api import CertificateAuthority, KubeApiServer, denied_except
from tests.support.kube_launcher import IMAGE, NAMESPACE, TOKEN, kube_api, make_spec, release

#: Seed 001's Role: ``batch/jobs`` create and get, nothing else.
SEED_001_ROLE = denied_except(("create", "jobs"), ("get", "jobs"))
#: The stand-in API server is on 127.0.0.1: these tests allow loopback and plain http on purpose.
STAND_IN_EGRESS = EgressPolicy(allow_plain_http=True, denied_networks=())


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApiServer]:
    with kube_api(tmp_path) as server:
        yield server


def access(api: KubeApiServer, **changes: Any) -> ClusterAccess:
    values: dict[str, Any] = {
        "server": api.url,
        "certificate_authority_data": api.ca_data,
        "client_certificate_data": api.client_certificate_data,
        "client_key_data": api.client_key_data,
        "timeout_seconds": 5.0,
        **changes,
    }
    return ClusterAccess(**values)


def launcher(api: KubeApiServer, **options: Any) -> KubernetesLauncher:
    access_changes = options.pop("access", {})
    options.setdefault("image", IMAGE)
    options.setdefault("egress", STAND_IN_EGRESS)
    return KubernetesLauncher(access(api, **access_changes), **options)


async def eventually(
    check: Callable[[], Awaitable[RunStatus]], accept: Callable[[RunStatus], bool], within: float = 20
) -> RunStatus:
    deadline = time.monotonic() + within
    while True:
        status = await check()
        if accept(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"last status: {status}")
        await asyncio.sleep(0.05)


async def wait_until(predicate: Callable[[], bool], within: float = 20) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


def job_env(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    main = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in main["env"]}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- launch -------------------------------------------------------------------------------------------


async def test_launch__creates_the_job_once(api: KubeApiServer, out_dir: Path) -> None:
    """Launching twice (the orchestrator restarted) creates one Job: the second create gets 409."""
    spec = make_spec(out_dir)
    k8s = launcher(api)

    first = (await k8s.launch(spec)).handle
    second = (await k8s.launch(spec)).handle

    assert first == second == f"k8s:{NAMESPACE}:{spec.deployment_id}"
    assert [j["metadata"]["name"] for j in api.objects("jobs", NAMESPACE)] == [spec.deployment_id]
    creates = [c.status for c in api.calls if c.method == "POST" and c.path.endswith("/jobs")]
    assert creates == [201, 409]
    await wait_until(lambda: (out_dir / "started").exists())
    assert len(api.objects("pods", NAMESPACE)) == 1


async def test_launch__token_travels_in_a_secret_owned_by_the_job(api: KubeApiServer, out_dir: Path) -> None:
    """The Job references the Secret; the kubelet resolves it; the Secret names the Job as its owner.
    What the launcher sent (the dry-run Secret, the Job, the Secret) passes Kubernetes' strict schemas."""
    spec = make_spec(out_dir)

    await launcher(api).launch(spec)
    await wait_until(lambda: (out_dir / "token").exists())

    (job,) = api.objects("jobs", NAMESPACE)
    (secret,) = api.objects("secrets", NAMESPACE)
    assert [(s.method, s.kind, s.dry_run) for s in api.sent] == [
        ("POST", "Secret", True),
        ("POST", "Job", False),
        ("POST", "Secret", False),
    ]
    api.assert_sent_valid()
    assert job_env(job)["TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert TOKEN not in str(job)
    assert base64.b64decode(secret["data"]["TOKEN"]).decode() == TOKEN
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [job["metadata"]["uid"]]
    assert (out_dir / "token").read_text() == TOKEN


async def test_launch__stale_secret_is_replaced(tmp_path: Path, out_dir: Path) -> None:
    """A Secret left with another value is replaced (PUT with its resourceVersion) and owned by the Job.

    (Without a kubelet here: a pod that started before the replacement would keep the old value. The value
    is the same on every launch of a deployment, so only a rotated server key can make it stale.)"""
    spec = make_spec(out_dir)
    stale = {"metadata": {"name": f"{spec.deployment_id}-token"}, "stringData": {"TOKEN": "stale"}}
    with kube_api(tmp_path, kubelet=False) as api:
        async with _raw_client(api) as client:
            created = await client.post(f"/api/v1/namespaces/{NAMESPACE}/secrets", json=stale)
            assert created.status_code == 201, created.text

        await launcher(api).launch(spec)

        (secret,) = api.objects("secrets", NAMESPACE)
        (job,) = api.objects("jobs", NAMESPACE)
        replaced = [c.status for c in api.calls if c.method == "PUT" and "/secrets/" in c.path]
    assert base64.b64decode(secret["data"]["TOKEN"]).decode() == TOKEN
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [job["metadata"]["uid"]]
    assert replaced == [200]


async def test_launch__token_as_a_value_without_secrets(api: KubeApiServer, out_dir: Path) -> None:
    """``token_in_secret=False`` (RBAC without secrets): no Secret, TOKEN is a plain value."""
    await launcher(api, token_in_secret=False).launch(make_spec(out_dir))
    await wait_until(lambda: (out_dir / "token").exists())

    (job,) = api.objects("jobs", NAMESPACE)
    assert job_env(job)["TOKEN"] == {"name": "TOKEN", "value": TOKEN}
    assert api.objects("secrets", NAMESPACE) == []
    assert (out_dir / "token").read_text() == TOKEN


# --- status -------------------------------------------------------------------------------------------


async def test_status__running_then_exited_with_the_exit_code(api: KubeApiServer, out_dir: Path) -> None:
    """RUNNING while the container runs; EXITED with its exit code and last log line once it ends."""
    k8s = launcher(api)
    handle = (await k8s.launch(make_spec(out_dir))).handle
    await wait_until(lambda: (out_dir / "started").exists())

    running = await eventually(lambda: k8s.status(handle), lambda s: s.detail is None)
    release(out_dir, 3)
    exited = await eventually(lambda: k8s.status(handle), lambda s: s.state is RunState.EXITED)

    assert running == RunStatus(state=RunState.RUNNING)
    assert exited == RunStatus(state=RunState.EXITED, exit_code=3, detail="runner: last words before exit 3")


async def test_status__succeeded(api: KubeApiServer, out_dir: Path) -> None:
    k8s = launcher(api)
    handle = (await k8s.launch(make_spec(out_dir))).handle
    release(out_dir, 0)

    exited = await eventually(lambda: k8s.status(handle), lambda s: s.state is RunState.EXITED)

    assert exited == RunStatus(state=RunState.EXITED, exit_code=0)
    await wait_until(lambda: "Complete" in str(api.objects("jobs", NAMESPACE)[0]["status"].get("conditions")))


async def test_status__stuck_pending_reports_the_warnings(tmp_path: Path, out_dir: Path) -> None:
    """A pod that cannot be scheduled is RUNNING until the scheduling delay, then EXITED with the warnings."""
    with kube_api(tmp_path, schedulable=False) as api:
        # Two seconds: creationTimestamp has whole seconds, as in Kubernetes.
        k8s = launcher(api, scheduling_delay_seconds=2.0)
        handle = (await k8s.launch(make_spec(out_dir))).handle

        early = await k8s.status(handle)
        stuck = await eventually(lambda: k8s.status(handle), lambda s: s.state is RunState.EXITED)

    assert early == RunStatus(state=RunState.RUNNING, detail="waiting for the runner pod to start")
    assert stuck.exit_code is None
    assert stuck.detail == (
        "the runner pod did not start within 2 s: FailedScheduling: 0/1 nodes are available: 1 Insufficient "
        "memory. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    )


async def test_status__unknown_image_is_stuck_with_the_pull_errors(api: KubeApiServer, out_dir: Path) -> None:
    k8s = launcher(api, image="registry.example.com/nowhere:1", scheduling_delay_seconds=0.5)
    handle = (await k8s.launch(make_spec(out_dir))).handle

    stuck = await eventually(lambda: k8s.status(handle), lambda s: s.state is RunState.EXITED)

    assert stuck.detail is not None
    assert 'Failed: Failed to pull image "registry.example.com/nowhere:1"' in stuck.detail
    assert "Failed: Error: ErrImagePull" in stuck.detail


async def test_status__pending_without_warnings_keeps_running(tmp_path: Path, out_dir: Path) -> None:
    """Past the delay but nothing wrong reported (no kubelet picks it up): still RUNNING, with a detail."""
    with kube_api(tmp_path, kubelet=False) as api:
        k8s = launcher(api, scheduling_delay_seconds=0.2)
        handle = (await k8s.launch(make_spec(out_dir))).handle
        await asyncio.sleep(0.4)

        status = await k8s.status(handle)

    assert status.state is RunState.RUNNING
    assert status.detail is not None and status.detail.startswith("the runner pod has not started after")


async def test_status__api_unreachable_is_unknown(api: KubeApiServer, out_dir: Path) -> None:
    k8s = launcher(api)
    handle = (await k8s.launch(make_spec(out_dir))).handle
    api.stop()

    status = await k8s.status(handle)

    assert status.state is RunState.UNKNOWN
    assert status.detail is not None and "unreachable" in status.detail


# --- cancel -------------------------------------------------------------------------------------------


async def test_cancel__deletes_the_job_in_the_background(api: KubeApiServer, out_dir: Path) -> None:
    """Cancel deletes the Job (propagationPolicy Background): its pod is stopped and removed, its Secret
    garbage-collected, and the run reads as EXITED."""
    k8s = launcher(api)
    handle = (await k8s.launch(make_spec(out_dir))).handle
    await wait_until(lambda: (out_dir / "started").exists())
    await wait_until(lambda: bool(api.running_pids()))
    (pid,) = api.running_pids()

    await k8s.cancel(handle, grace_seconds=5)

    assert api.objects("jobs", NAMESPACE) == []
    (delete,) = [c for c in api.calls if c.method == "DELETE"]
    assert "propagationPolicy=Background" in delete.query
    await wait_until(lambda: not api.objects("pods", NAMESPACE) and not api.objects("secrets", NAMESPACE))
    assert not pid_alive(pid)
    status = await k8s.status(handle)
    assert status.state is RunState.EXITED and status.detail is not None and "is gone" in status.detail
    await k8s.cancel(handle, grace_seconds=5)  # a Job already gone is fine


# --- errors -------------------------------------------------------------------------------------------


async def test_launch__wrong_token_is_not_retryable(tmp_path: Path, out_dir: Path) -> None:
    """A bearer token the API refuses (401) is a configuration error: retrying cannot help."""
    with kube_api(tmp_path, auth="token", tokens={"the-right-token"}) as api:
        k8s = launcher(
            api, access={"client_certificate_data": None, "client_key_data": None, "token": "wrong"}
        )
        with pytest.raises(LaunchError) as caught:
            await k8s.launch(make_spec(out_dir))
        status = await k8s.status(f"k8s:{NAMESPACE}:whatever")

    assert caught.value.retryable is False
    assert "401 Unauthorized" in caught.value.message
    assert status.state is RunState.UNKNOWN


async def test_launch__service_account_token(tmp_path: Path, out_dir: Path) -> None:
    with kube_api(tmp_path, auth="token", tokens={"the-right-token"}) as api:
        k8s = launcher(
            api, access={"client_certificate_data": None, "client_key_data": None, "token": "the-right-token"}
        )

        handle = (await k8s.launch(make_spec(out_dir))).handle

        assert handle.startswith("k8s:")
        assert len(api.objects("jobs", NAMESPACE)) == 1


async def test_kube_api__rejects_a_client_certificate_from_another_ca(
    api: KubeApiServer, out_dir: Path
) -> None:
    """The stand-in checks client certificates at the TLS layer: the cluster's is accepted, another is not,
    and the launcher reports the refusal as a LaunchError."""
    rogue = CertificateAuthority("rogue").issue("platform-orchestrator", server=False)
    good = _ssl_context(api, api.client.cert_pem, api.client.key_pem)
    bad = _ssl_context(api, rogue.cert_pem, rogue.key_pem)

    async with httpx.AsyncClient(verify=good) as client:
        assert (await client.get(f"{api.url}/version")).status_code == 200
    async with httpx.AsyncClient(verify=bad) as client:
        with pytest.raises(httpx.TransportError):
            await client.get(f"{api.url}/version")
    k8s = launcher(
        api, access={"client_certificate_data": rogue.cert_data, "client_key_data": rogue.key_data}
    )
    with pytest.raises(LaunchError) as caught:
        await k8s.launch(make_spec(out_dir))
    assert "unreachable" in caught.value.message
    assert api.objects("jobs", NAMESPACE) == []


async def test_launch__untrusted_server_certificate_is_not_retryable(
    api: KubeApiServer, out_dir: Path
) -> None:
    """A server whose certificate the configured CA did not sign is refused, for good."""
    other_ca = base64.b64encode(CertificateAuthority("other").pem).decode()
    k8s = launcher(api, access={"certificate_authority_data": other_ca})

    with pytest.raises(LaunchError) as caught:
        await k8s.launch(make_spec(out_dir))

    assert caught.value.retryable is False
    assert "CERTIFICATE_VERIFY_FAILED" in caught.value.message


async def test_launch__unknown_namespace_is_not_retryable(api: KubeApiServer, out_dir: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        await launcher(api).launch(make_spec(out_dir, namespace="missing"))

    assert caught.value.retryable is False
    assert 'namespaces "missing" not found' in caught.value.message


async def test_launch__error_answers_without_content_type_are_read_as_the_clusters_error(
    api: KubeApiServer, out_dir: Path
) -> None:
    """A cluster (or a proxy in front of it) answering errors without Content-Type: the launch fails with
    the cluster's message, not "unexpected KeyError" (issue 26)."""
    api.untyped_errors = True

    with pytest.raises(LaunchError) as missing:
        await launcher(api).launch(make_spec(out_dir, namespace="missing"))
    api.forbidden.add(("create", "jobs"))
    with pytest.raises(LaunchError) as refused:
        await launcher(api).launch(make_spec(out_dir))

    assert missing.value.retryable is False
    assert 'namespaces "missing" not found' in missing.value.message
    assert refused.value.retryable is False
    assert "403 Forbidden" in refused.value.message
    assert "cannot create resource" in refused.value.message


async def test_launch__pod_template_field_of_the_wrong_type_fails_naming_it(
    api: KubeApiServer, out_dir: Path
) -> None:
    """A toleration's ``value: 1`` (YAML reads an unquoted number) passes the runner's validation, but no
    Kubernetes Job has it: the launch fails for good naming the field of the pod template, and no Job is
    sent (it is not "an API that does not answer like Kubernetes", to be retried)."""
    spec = make_spec(out_dir)
    toleration = {"key": "dedicated", "operator": "Equal", "value": 1, "effect": "NoSchedule"}
    job = {**spec.runner_configuration["job"], "pod_template": {"spec": {"tolerations": [toleration]}}}
    wrong = spec.model_copy(update={"runner_configuration": {**spec.runner_configuration, "job": job}})

    with pytest.raises(LaunchError) as caught:
        await launcher(api).launch(wrong)

    assert caught.value.message == (
        "invalid job configuration of runner 'k8s': the Job it makes is not a Kubernetes Job: "
        "job.pod_template.spec.tolerations[0].value: Expected `str | null`, got `int`"
    )
    assert caught.value.retryable is False
    assert [s.kind for s in api.sent if not s.dry_run] == []
    assert api.objects("jobs", NAMESPACE) == []


async def test_launch__unknown_pod_template_field_is_left_out_of_the_job(
    api: KubeApiServer, out_dir: Path
) -> None:
    """A container field Kubernetes does not know (misspelled) is not sent, as the API server would drop
    it: the Job sent passes the strict schemas, with the runner's default pull policy."""
    spec = make_spec(out_dir)
    template = {"spec": {"containers": [{"name": "main", "imagePullPolcy": "Always"}]}}
    job = {**spec.runner_configuration["job"], "pod_template": template}
    typo = spec.model_copy(update={"runner_configuration": {**spec.runner_configuration, "job": job}})

    await launcher(api).launch(typo)

    (sent,) = [s.body for s in api.sent if s.kind == "Job"]
    (main,) = sent["spec"]["template"]["spec"]["containers"]
    assert "imagePullPolcy" not in main
    assert main["imagePullPolicy"] == "IfNotPresent"
    api.assert_sent_valid()


async def test_launch__seed_001_role_puts_the_token_in_the_job_with_a_note(
    tmp_path: Path, out_dir: Path
) -> None:
    """Seed 001's Role (``batch/jobs`` create, get; nothing else): the dry-run create of the Secret is
    refused, so ``TOKEN`` goes into the Job's spec as a plain value (upstream's way), the run gets it,
    and the launch's note names the cause and what to allow; it never holds the token."""
    with kube_api(tmp_path, forbidden=SEED_001_ROLE) as api:
        started = await launcher(api).launch(make_spec(out_dir))
        await wait_until(lambda: (out_dir / "token").exists())
        (job,) = api.objects("jobs", NAMESPACE)
        secrets = api.objects("secrets", NAMESPACE)
        probes = [c for c in api.calls if c.method == "POST" and c.path.endswith("/secrets")]
        sent = [(s.kind, s.dry_run) for s in api.sent]
        api.assert_sent_valid()

    assert sent == [("Secret", True), ("Job", False)]  # the refused dry run is checked too
    assert started.handle == f"k8s:{NAMESPACE}:{job['metadata']['name']}"
    assert job_env(job)["TOKEN"] == {"name": "TOKEN", "value": TOKEN}
    assert secrets == []
    assert [("dryRun=All" in c.query, c.status) for c in probes] == [(True, 403)]
    assert (out_dir / "token").read_text() == TOKEN
    assert started.note is not None
    assert "TOKEN is a plain value in the Job's spec" in started.note
    assert f"may not create Secrets in namespace {NAMESPACE} (403 Forbidden:" in started.note
    assert (
        f"allow the orchestrator create, get and update on secrets in namespace {NAMESPACE}" in started.note
    )
    assert TOKEN not in started.note


async def test_launch__relaunch_adopts_the_plain_token_job_and_keeps_the_note(
    tmp_path: Path, out_dir: Path
) -> None:
    """A second launch (the orchestrator restarted) adopts the Job the first made, whatever the Role
    allows by then: no Secret for a Job that does not read one, and the note still says so."""
    spec = make_spec(out_dir)
    with kube_api(tmp_path, forbidden=SEED_001_ROLE, kubelet=False) as api:
        first = await launcher(api).launch(spec)
        api.forbidden.clear()  # secrets allowed now
        second = await launcher(api).launch(spec)
        secrets = api.objects("secrets", NAMESPACE)
        (job,) = api.objects("jobs", NAMESPACE)

    assert first.handle == second.handle
    assert secrets == []
    assert job_env(job)["TOKEN"] == {"name": "TOKEN", "value": TOKEN}
    assert second.note is not None and "the Job was created so by an earlier launch" in second.note


async def test_launch__secret_that_cannot_be_replaced_removes_the_job(tmp_path: Path, out_dir: Path) -> None:
    """Secrets may be created but a stale one may not be updated: the pod would wait for its token
    forever, so the Job is deleted and the error says what the orchestrator needs."""
    spec = make_spec(out_dir)
    stale = {"metadata": {"name": f"{spec.deployment_id}-token"}, "stringData": {"TOKEN": "stale"}}
    with kube_api(tmp_path, forbidden={("update", "secrets")}, kubelet=False) as api:
        async with _raw_client(api) as client:
            created = await client.post(f"/api/v1/namespaces/{NAMESPACE}/secrets", json=stale)
            assert created.status_code == 201, created.text
        with pytest.raises(LaunchError) as caught:
            await launcher(api).launch(spec)
        jobs = api.objects("jobs", NAMESPACE)

    assert caught.value.retryable is False
    assert "403 Forbidden" in caught.value.message
    assert "needs create, get and update on secrets" in caught.value.message
    assert jobs == []


def docs_role() -> set[tuple[str, str]]:
    """Every rule of docs/runners/kubernetes.md's Role, as (verb, resource) pairs."""
    rules = yaml.safe_load(docs_example("runners/kubernetes-role-rules"))["rules"]
    return {(verb, res) for rule in rules for res in rule["resources"] for verb in rule["verbs"]}


async def test_launch__the_docs_role_puts_the_token_in_a_secret_and_sees_the_exit_code(
    tmp_path: Path, out_dir: Path
) -> None:
    """The Role docs/runners/kubernetes.md prints (seed 001's with the Secret rules and the stuck
    diagnosis), applied as the stand-in's RBAC: the TOKEN travels in a Secret, no note says otherwise, and a
    failed run's exit code is read from its pod."""
    with kube_api(tmp_path, forbidden=denied_except(*docs_role())) as api:
        k8s = launcher(api)
        started = await k8s.launch(make_spec(out_dir))
        await wait_until(lambda: (out_dir / "token").exists())
        (job,) = api.objects("jobs", NAMESPACE)
        release(out_dir, 3)
        failed = await eventually(lambda: k8s.status(started.handle), lambda s: s.state is RunState.EXITED)

    assert started.note is None
    assert "secretKeyRef" in job_env(job)["TOKEN"]["valueFrom"]
    assert 3 == failed.exit_code


async def test_status__without_pods_and_events_list_still_ends_the_run(tmp_path: Path, out_dir: Path) -> None:
    """Seed 001's Role lists no pods or events: the status comes from the Job alone, so a failed run
    is EXITED without its exit code, saying what the orchestrator cannot see; a good one exits 0."""
    with kube_api(tmp_path, forbidden=SEED_001_ROLE) as api:
        k8s = launcher(api)
        failing = (await k8s.launch(make_spec(out_dir))).handle
        release(out_dir, 3)
        failed = await eventually(lambda: k8s.status(failing), lambda s: s.state is RunState.EXITED)
        other = out_dir / "other"
        other.mkdir()
        good = (await k8s.launch(make_spec(other, deployment="6a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"))).handle
        release(other, 0)
        succeeded = await eventually(lambda: k8s.status(good), lambda s: s.state is RunState.EXITED)

    assert failed.exit_code is None
    assert failed.detail == (
        "BackoffLimitExceeded: Job has reached the specified backoff limit (the orchestrator may not list "
        f"pods in namespace {NAMESPACE} (allow pods list in its Role): the exit code and the runner's last "
        "words are unknown)"
    )
    assert succeeded == RunStatus(state=RunState.EXITED, exit_code=0)


async def test_status__stuck_without_pods_and_events_list_keeps_running(
    tmp_path: Path, out_dir: Path
) -> None:
    """A pod that cannot be scheduled, seen without pods and events: RUNNING past the delay (only the
    deployment timeout ends it), and the detail says why the reason is not known."""
    with kube_api(tmp_path, forbidden=SEED_001_ROLE, schedulable=False) as api:
        k8s = launcher(api, scheduling_delay_seconds=0.2)
        handle = (await k8s.launch(make_spec(out_dir))).handle
        await asyncio.sleep(0.4)

        status = await k8s.status(handle)

    assert status.state is RunState.RUNNING
    assert status.detail is not None
    assert status.detail.startswith("the runner pod has not started after")
    assert f"may not list pods and events in namespace {NAMESPACE}" in status.detail


async def test_launch__unreachable_api_is_retryable(api: KubeApiServer, out_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    k8s = launcher(api, access={"server": f"https://127.0.0.1:{closed_port}"})

    with pytest.raises(LaunchError) as caught:
        await k8s.launch(make_spec(out_dir))

    assert caught.value.retryable is True


async def test_launch__through_the_proxy_url(api: KubeApiServer, out_dir: Path) -> None:
    """``cluster_data.proxy_url``: requests go through an HTTP CONNECT proxy."""
    async with _connect_proxy() as (proxy_url, targets):
        handle = (await launcher(api, access={"proxy_url": proxy_url}).launch(make_spec(out_dir))).handle

    assert handle.startswith("k8s:")
    assert targets and set(targets) == {api.url.removeprefix("https://")}


# --- helpers ------------------------------------------------------------------------------------------


def _ssl_context(api: KubeApiServer, cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=api.ca.pem.decode())
    directory = api.work_dir / f"client-{os.urandom(4).hex()}"
    directory.mkdir()
    (directory / "tls.crt").write_bytes(cert_pem)
    (directory / "tls.key").write_bytes(key_pem)
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    return context


@contextlib.asynccontextmanager
async def _raw_client(api: KubeApiServer) -> AsyncIterator[httpx.AsyncClient]:
    context = _ssl_context(api, api.client.cert_pem, api.client.key_pem)
    async with httpx.AsyncClient(base_url=api.url, verify=context) as client:
        yield client


@contextlib.asynccontextmanager
async def _connect_proxy() -> AsyncIterator[tuple[str, list[str]]]:
    """A minimal HTTP CONNECT proxy on 127.0.0.1; yields its URL and the targets it tunnelled to."""
    targets: list[str] = []
    writers: list[asyncio.StreamWriter] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = (await reader.readuntil(b"\r\n\r\n")).decode()
        method, target, _ = request.split("\r\n", 1)[0].split(" ", 2)
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            writer.close()
            return
        targets.append(target)
        host, port = target.rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writers.extend((writer, upstream_writer))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", targets
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


# --- the stand-in's own semantics (what the launcher relies on) -----------------------------------


async def test_kube_api__an_object_failing_the_schemas_fails_the_test(tmp_path: Path, out_dir: Path) -> None:
    """A pod template whose memory limit is a list (the runner's validation does not look inside
    ``resources``; lightkube's Job model takes any quantity) makes a Job the real API server refuses. The
    stand-in accepts it, but leaving it raises, naming the request and the field: a launcher that sent
    such an object fails its test. ``check_schemas=False`` leaves it alone."""
    spec = make_spec(out_dir)
    template = {"spec": {"containers": [{"name": "main", "resources": {"limits": {"memory": ["1Gi"]}}}]}}
    job = {**spec.runner_configuration["job"], "pod_template": template}
    wrong = spec.model_copy(update={"runner_configuration": {**spec.runner_configuration, "job": job}})

    with pytest.raises(AssertionError) as caught, kube_api(tmp_path / "a", kubelet=False) as api:
        await launcher(api).launch(wrong)
    with kube_api(tmp_path / "b", kubelet=False, check_schemas=False) as unchecked:
        await launcher(unchecked).launch(wrong)

    assert [c.status for c in api.calls if c.path.endswith("/jobs")] == [201]
    message = str(caught.value)
    assert f"POST /apis/batch/v1/namespaces/{NAMESPACE}/jobs: Kubernetes " in message
    assert "spec.template.spec.containers.0.resources.limits.memory: ['1Gi'] is not valid" in message
    assert "/secrets" not in message  # the Secrets it sent are valid
    assert len(unchecked.schema_problems()) == 2  # newest Kubernetes and 1.30


async def test_kube_api__replace_with_a_stale_resource_version_conflicts(api: KubeApiServer) -> None:
    """Optimistic concurrency (client-go's lease lock relies on it): a stale resourceVersion gets 409."""
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "lock"},
        "spec": {},
    }
    base = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    async with _raw_client(api) as client:
        created = (await client.post(base, json=lease)).json()
        first = await client.put(f"{base}/lock", json={**created, "spec": {"holderIdentity": "a"}})
        stale = await client.put(f"{base}/lock", json={**created, "spec": {"holderIdentity": "b"}})
        again = await client.post(base, json=lease)

    assert first.status_code == 200
    assert int(first.json()["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert (stale.status_code, stale.json()["reason"], stale.json()["kind"]) == (409, "Conflict", "Status")
    assert (again.status_code, again.json()["reason"]) == (409, "AlreadyExists")


async def test_kube_api__lists_with_selectors(api: KubeApiServer) -> None:
    """``kind: XList``; label selectors (equality, set, existence); unknown field labels refused."""
    base = f"/api/v1/namespaces/{NAMESPACE}/secrets"
    async with _raw_client(api) as client:
        for name, labels in (("a", {"tier": "x", "team": "1"}), ("b", {"tier": "y"}), ("c", {})):
            await client.post(base, json={"metadata": {"name": name, "labels": labels}})

        async def names(**params: str) -> list[str]:
            answer = (await client.get(base, params=params)).json()
            assert answer["kind"] == "SecretList"
            return [item["metadata"]["name"] for item in answer["items"]]

        assert await names(labelSelector="tier=x") == ["a"]
        assert await names(labelSelector="tier in (x,y),!team") == ["b"]
        assert await names(labelSelector="tier!=x") == ["b", "c"]
        assert await names(fieldSelector="metadata.name=c") == ["c"]
        refused = await client.get(base, params={"fieldSelector": "data.TOKEN=x"})
    assert (refused.status_code, refused.json()["reason"]) == (400, "BadRequest")


async def test_kube_api__protobuf_lease_create_twice_conflicts(api: KubeApiServer) -> None:
    """A Lease sent as client-go sends it (protobuf) is stored as its JSON form; a second create of it
    is 409 AlreadyExists (two Terraforms racing for the lock: the second is refused), and a protobuf
    replace with a stale resourceVersion is 409 Conflict."""
    lease: dict[str, Any] = {
        "metadata": {"name": "lock", "labels": {"tfstate": "true"}},
        "spec": {"holderIdentity": "a"},
    }
    base = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    headers = {"Content-Type": "application/vnd.kubernetes.protobuf"}
    async with _raw_client(api) as client:
        created = await client.post(base, content=kube_protobuf.encode_lease(lease), headers=headers)
        again = await client.post(base, content=kube_protobuf.encode_lease(lease), headers=headers)
        stored = created.json()
        stale = {"metadata": {"name": "lock", "resourceVersion": "1"}, "spec": {}}
        replaced = await client.put(
            f"{base}/lock", content=kube_protobuf.encode_lease(stale), headers=headers
        )

    assert created.status_code == 201, created.text
    assert stored["spec"] == {"holderIdentity": "a"}
    assert stored["metadata"]["labels"] == {"tfstate": "true"}
    assert (again.status_code, again.json()["reason"]) == (409, "AlreadyExists")
    assert (replaced.status_code, replaced.json()["reason"]) == (409, "Conflict")
    assert api.objects("leases", NAMESPACE)[0]["spec"] == {"holderIdentity": "a"}


async def test_kube_api__service_accounts_only_on_the_in_cluster_endpoint(api: KubeApiServer) -> None:
    """The in-cluster endpoint takes no client certificate's word: without a projected token it is 401;
    the main endpoint does not take service account tokens."""
    context = ssl.create_default_context(cadata=api.ca.pem.decode())
    async with httpx.AsyncClient(base_url=api.in_cluster_url, verify=context) as client:
        anonymous = await client.get(f"/api/v1/namespaces/{NAMESPACE}/secrets")
        forged = await client.get(
            f"/api/v1/namespaces/{NAMESPACE}/secrets", headers={"Authorization": "Bearer made-up"}
        )

    assert anonymous.status_code == 401
    assert forged.status_code == 401
