"""A stand-in Kubernetes API server for tests. It is NOT Kubernetes: nothing real is installable here.

It implements, with the API's real semantics, only what our launcher (and a kubelet) touch:

- ``batch/v1`` Jobs, ``v1`` Pods, Events, Secrets, ``coordination.k8s.io/v1`` Leases: create (409
  ``AlreadyExists``; ``generateName``; 404 for an unknown namespace; 422 ``Invalid`` for a bad name or Job),
  get, list (``kind: XList``; ``labelSelector`` with equality, set-based and existence terms;
  ``fieldSelector`` on the fields the real server indexes, others refused with 400; ``limit``/``continue``),
  replace (``resourceVersion`` checked: 409 ``Conflict``; the ``status`` of Jobs and Pods kept), merge patch
  (``application/merge-patch+json`` only: other patch types answer 415), delete (``propagationPolicy``
  from the query or the DeleteOptions body, Jobs defaulting to ``Orphan`` as batch/v1 does; garbage
  collection through ``ownerReferences``; graceful deletion of running pods). Errors are ``metav1.Status``
  bodies. Every write bumps one global ``resourceVersion``. ``?dryRun=All`` creates check everything
  (authorization included) and store nothing. Leases may come as protobuf
  (``application/vnd.kubernetes.protobuf``, as client-go's typed clients send them: tests/support/
  kube_protobuf.py); everything is answered in JSON. No watches. Discovery: ``GET /api/v1`` and
  ``GET /apis/<group>/<version>`` answer the ``APIResourceList`` of the kinds above (what Helm's ``lookup``
  asks before it reads an object).
- Authentication: a bearer token from ``tokens`` or accepted by ``token_review`` (webhook token
  authentication, as clusters of the clouds check their tokens), or a TLS client certificate signed by the
  cluster CA (``auth="client-cert"``: the TLS layer requires it, so a wrong certificate fails the handshake;
  unlike Go's server, Python's closes the connection without sending the TLS alert, so the client sees an
  EOF rather than "unknown ca"). The real API server accepts either on one port; this one does one per
  instance. That client is the user ``platform-orchestrator``; ``forbidden`` denies it (verb, resource)
  pairs with the real 403 message, to play a missing RBAC rule (``denied_except``: a Role's allow-list).
- Kubernetes' schemas: every object a client sends to create or replace is kept as it was sent in
  ``sent`` (dry runs, and requests refused by RBAC or by the stand-in, included), and leaving the ``with``
  block checks each with ``kubernetes-validate --strict`` for the newest Kubernetes and 1.30
  (tests/support/kube_schema.py; ``apiVersion``/``kind`` taken from the URL when the body leaves them out,
  as the real server does). One that fails raises ``AssertionError`` naming the request and the field, so
  a test whose client sent something the real API would refuse fails (``check_schemas=False`` for a test
  that sends such objects on purpose). The stand-in itself answers as if all were well: only the check
  afterwards fails the test.
- In-cluster access (``in_cluster``, the default with TLS): a second TLS listener, ``in_cluster_url``,
  standing in for the ``kubernetes.default`` Service, takes only the service account tokens the kubelet
  projects into pods (bound: valid while the pod exists) and authorizes each service account by
  ``service_accounts`` (``namespace/name`` -> allowed (verb, resource) pairs; nothing else, as in a real
  cluster). The kubelet gives each pod ``KUBERNETES_SERVICE_HOST``/``PORT`` and writes the token, the CA
  and the namespace to the pod's directory: it cannot mount them at
  ``/var/run/secrets/kubernetes.io/serviceaccount``, where client-go's InClusterConfig reads them, so it
  writes a kubeconfig equal to what InClusterConfig builds beside them, whose path an image can ask for
  (``LocalImage.in_cluster_kubeconfig_env``).
- A Job controller (one pod per attempt, ``backoffLimit``, ``Complete``/``Failed`` conditions with
  ``SuccessCriteriaMet``/``FailureTarget`` first, events, ``ttlSecondsAfterFinished``), a scheduler
  (``schedulable=False`` keeps pods Pending with a ``FailedScheduling`` Warning event) and a kubelet
  (``kubelet=True``) that runs the pod's ``main`` container (else its first) as a local process: the
  container's ``command`` + ``args``, or for an image in ``images`` that image's entrypoint + ``args``;
  env from ``value``, ``secretKeyRef`` (a missing Secret gives ``CreateContainerConfigError`` and retries),
  ``fieldRef`` and ``envFrom`` Secrets, with ``$(VAR)`` expansion. An unknown image gives ``ErrImagePull`` /
  ``ImagePullBackOff`` with Warning events. The exit code becomes the container's ``terminated`` state and
  the pod phase; ``FallbackToLogsOnError`` puts the log tail in the termination message. Volumes are not
  mounted: a ``LocalImage`` names the variable that receives the local directory backing a mount path.
  Other containers (sidecars, init containers) are not run; ``restartPolicy`` is treated as ``Never``.

Usage::

    with KubeApiServer(tmp_path, images={RUNNER_IMAGE: LocalImage(argv=[...])}) as api:
        api.url, api.ca_data, api.client_certificate_data, api.client_key_data   # kubeconfig values
        api.objects("jobs", "default")                                           # a snapshot
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import datetime as dt
import ipaddress
import json
import os
import re
import secrets
import signal
import socket
import ssl
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.support import kube_protobuf
from tests.support.kube_schema import schema_problems

T = TypeVar("T")
NODE_NAME = "stand-in-node"
TERMINATION_LOG_LINES = 80
TERMINATION_LOG_BYTES = 2048
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
RUNNER_IMAGE_ARGV = [sys.executable, "-m", "orchestrator.cli.runner"]
PROTOBUF = "application/vnd.kubernetes.protobuf"


@dataclass(frozen=True)
class Kind:
    plural: str
    group: str  # "" for core
    version: str
    kind: str
    fields: frozenset[str] = frozenset()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``jobs.batch`` / ``pods``: how the real server names the resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


_META = frozenset({"metadata.name", "metadata.namespace"})
KINDS = {
    k.plural: k
    for k in (
        Kind("jobs", "batch", "v1", "Job", _META | {"status.successful"}),
        Kind(
            "pods",
            "",
            "v1",
            "Pod",
            _META
            | {
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            },
        ),
        Kind(
            "events",
            "",
            "v1",
            "Event",
            _META
            | {f"involvedObject.{f}" for f in ("kind", "namespace", "name", "uid", "apiVersion", "fieldPath")}
            | {"involvedObject.resourceVersion", "reason", "reportingComponent", "source", "type"},
        ),
        Kind("secrets", "", "v1", "Secret", _META | {"type"}),
        Kind("leases", "coordination.k8s.io", "v1", "Lease", _META),
    )
}


@dataclass(frozen=True)
class LocalImage:
    """What the kubelet runs for an image: its entrypoint, its ENV, and where mounts land locally."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    #: mountPath -> variable set to the local directory standing in for that mount.
    mount_env: dict[str, str] = field(default_factory=dict)
    #: The variable set to the path of a kubeconfig holding the pod's in-cluster configuration (see
    #: ``InCluster``): what client-go's InClusterConfig would read, which cannot be at its fixed path here.
    in_cluster_kubeconfig_env: str | None = None


@dataclass(frozen=True)
class InCluster:
    """The in-cluster API endpoint (the ``kubernetes.default`` Service's address in a real cluster): a
    second TLS listener of the stand-in taking service account tokens only, and the CA pods trust."""

    host: str
    port: int
    ca_pem: bytes


#: Where the ServiceAccount admission plugin mounts the pod's token, the cluster CA and its namespace.
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class ApiError(Exception):
    """Answered as a ``metav1.Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return JSONResponse(body, status_code=self.code)


def _not_found(kind: Kind, name: str) -> ApiError:
    details = {"name": name, "group": kind.group, "kind": kind.plural}
    return ApiError(404, "NotFound", f'{kind.qualified} "{name}" not found', details)


def _invalid(kind: Kind, name: str, causes: list[tuple[str, str]]) -> ApiError:
    text = ", ".join(f"{f}: {m}" for f, m in causes)
    group = f".{kind.group}" if kind.group else ""
    details = {
        "name": name,
        "group": kind.group,
        "kind": kind.kind,
        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes],
    }
    return ApiError(422, "Invalid", f'{kind.kind}{group} "{name}" is invalid: {text}', details)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(value: str) -> float:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


# --- selectors --------------------------------------------------------------------------------------

_TERM = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9_.-]*)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector: ``op`` is one of = != in notin exists !exists."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        return {
            "=": value in self.values,
            "!=": value not in self.values,
            "in": value in self.values,
            "notin": value not in self.values,
            "exists": self.key in labels,
            "!exists": self.key not in labels,
        }[self.op]


def label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A matcher for a label selector (``a=b,c!=d,e in (f,g),!h,i``); ValueError when it does not parse."""
    requirements: list[Requirement] = []
    for term in _split_terms(selector):
        match = _TERM.match(term)
        if match is None or (match["neg"] and (match["op"] or match["setop"])):
            raise ValueError(f"unable to parse requirement: {term!r}")
        key = match["key"]
        if match["setop"]:
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            requirements.append(Requirement(key, match["setop"], values))
        elif match["op"]:
            requirements.append(
                Requirement(key, "!=" if match["op"] == "!=" else "=", frozenset({match["value"]}))
            )
        else:
            requirements.append(Requirement(key, "!exists" if match["neg"] else "exists"))
    return lambda labels: all(r.matches(labels) for r in requirements)


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    if path == "source":
        return str((obj.get("source") or {}).get("component", ""))
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def field_selector(kind: Kind, selector: str) -> Callable[[Mapping[str, Any]], bool]:
    """A matcher for a field selector on the fields the real server supports for ``kind``; else 400."""
    terms: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector):
        match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if match is None:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        path, op, value = match.groups()
        if path not in kind.fields:
            raise ApiError(400, "BadRequest", f'field label not supported: "{path}"')
        terms.append((path, op != "!=", value))
    return lambda obj: all((_field_value(obj, path) == value) is equal for path, equal, value in terms)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, Mapping):
        return patch
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- certificates -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert_data(self) -> str:
        """Base64 PEM, as in a kubeconfig's ``*-data`` fields."""
        return base64.b64encode(self.cert_pem).decode()

    @property
    def key_data(self) -> str:
        return base64.b64encode(self.key_pem).decode()


class CertificateAuthority:
    """A throwaway CA (EC P-256) issuing server and client certificates."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, *, server: bool, organization: str | None = None) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            names.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(names))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


# --- the cluster state --------------------------------------------------------------------------------


@dataclass
class Container:
    log: Path
    started_at: str
    process: asyncio.subprocess.Process | None = None  # None while starting
    waiter: asyncio.Task[None] | None = None  # the graceful termination, once the pod is being deleted


class Cluster:
    """Objects, controllers and kubelet; lives on the server's event loop (never touched from elsewhere)."""

    def __init__(
        self,
        work_dir: Path,
        *,
        namespaces: Iterable[str],
        images: Mapping[str, LocalImage],
        schedulable: bool,
        kubelet: bool,
        unschedulable_message: str,
        tick_seconds: float,
        in_cluster: InCluster | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.in_cluster = in_cluster
        #: Service account tokens the kubelet projected: token -> (namespace, service account, pod uid).
        #: A token is valid while its pod exists (a bound token, as the TokenRequest API issues them).
        self.tokens: dict[str, tuple[str, str, str]] = {}
        self.namespaces = set(namespaces)
        self.images = dict(images)
        self.schedulable = schedulable
        self.kubelet = kubelet
        self.unschedulable_message = unschedulable_message
        self.tick_seconds = tick_seconds
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.resource_version = 1000
        self.containers: dict[str, Container] = {}  # by pod uid
        self.tasks: set[asyncio.Task[None]] = set()
        self.changed = asyncio.Event()

    # --- store --------------------------------------------------------------------------------------

    def _bump(self, obj: dict[str, Any]) -> None:
        self.resource_version += 1
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        self.changed.set()

    def find(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        obj = self.objects.get((plural, namespace, name))
        if obj is None:
            raise _not_found(KINDS[plural], name)
        return obj

    def items(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            obj
            for (p, ns, _), obj in sorted(self.objects.items())
            if p == plural and (namespace is None or ns == namespace)
        ]

    def create(
        self, plural: str, namespace: str, body: dict[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Store a new object; ``dry_run`` (``?dryRun=All``): every check, nothing stored or changed."""
        kind = KINDS[plural]
        if (
            body.get("apiVersion", kind.api_version) != kind.api_version
            or body.get("kind", kind.kind) != kind.kind
        ):
            raise ApiError(
                400,
                "BadRequest",
                f"the API version in the data ({body.get('apiVersion')}) does not match the expected API "
                f"version ({kind.api_version})",
            )
        obj: dict[str, Any] = json.loads(json.dumps(body))
        metadata = obj.setdefault("metadata", {})
        if metadata.get("namespace", namespace) != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if namespace not in self.namespaces:
            raise ApiError(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + secrets.token_hex(3)[:5]
        name = metadata.get("name") or ""
        problems = self._validate(kind, obj)
        if problems:
            raise _invalid(kind, name, problems)
        if (plural, namespace, name) in self.objects:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{kind.qualified} "{name}" already exists',
                {"name": name, "group": kind.group, "kind": kind.plural},
            )
        metadata.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=_now())
        for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            metadata.pop(key, None)
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        if dry_run:
            if plural == "secrets":
                self._default_secrets(obj)
            return obj
        getattr(self, f"_default_{plural}", lambda o: None)(obj)
        self.objects[(plural, namespace, name)] = obj
        self._bump(obj)
        return obj

    def _validate(self, kind: Kind, obj: dict[str, Any]) -> list[tuple[str, str]]:
        name = obj["metadata"].get("name") or ""
        problems: list[tuple[str, str]] = []
        if not name:
            problems.append(("metadata.name", "Required value: name or generateName is required"))
        elif len(name) > 253 or not DNS_SUBDOMAIN.match(name):
            problems.append(
                ("metadata.name", f'Invalid value: "{name}": must be a lowercase RFC 1123 subdomain')
            )
        for key, value in (obj["metadata"].get("labels") or {}).items():
            if not isinstance(value, str) or len(value) > 63:
                problems.append(
                    (f"metadata.labels[{key}]", "Invalid value: must be no more than 63 characters")
                )
        if kind.plural == "jobs":
            if (name and not DNS_LABEL.match(name)) or len(name) > 63:
                problems.append(("metadata.name", f'Invalid value: "{name}": must be a DNS label'))
            pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
            if not pod.get("containers"):
                problems.append(("spec.template.spec.containers", "Required value"))
            if pod.get("restartPolicy") not in ("Never", "OnFailure"):
                problems.append(
                    (
                        "spec.template.spec.restartPolicy",
                        f'Unsupported value: "{pod.get("restartPolicy")}": '
                        'supported values: "OnFailure", "Never"',
                    )
                )
        if kind.plural == "pods" and not (obj.get("spec") or {}).get("containers"):
            problems.append(("spec.containers", "Required value"))
        if kind.plural == "secrets":
            for key, value in (obj.get("data") or {}).items():
                try:
                    base64.b64decode(value, validate=True)
                except (ValueError, TypeError):
                    problems.append((f"data[{key}]", "Invalid value: not base64"))
        return problems

    def _default_secrets(self, obj: dict[str, Any]) -> None:
        data = obj.setdefault("data", {})
        for key, value in (obj.pop("stringData", None) or {}).items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        obj.setdefault("type", "Opaque")

    def _default_jobs(self, obj: dict[str, Any]) -> None:
        uid, name = obj["metadata"]["uid"], obj["metadata"]["name"]
        spec = obj.setdefault("spec", {})
        spec.setdefault("parallelism", 1)
        spec.setdefault("completions", 1)
        spec.setdefault("backoffLimit", 6)
        spec.setdefault("completionMode", "NonIndexed")
        spec.setdefault("suspend", False)
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
        controller = {"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid}
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
        labels.update({**controller, "batch.kubernetes.io/job-name": name, "job-name": name})
        obj["metadata"]["generation"] = 1
        obj["status"] = {}

    def _default_pods(self, obj: dict[str, Any]) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("serviceAccountName", "default")
        for container in spec.get("containers", []):
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("imagePullPolicy", "IfNotPresent")
        obj["status"] = {"phase": "Pending", "qosClass": "Burstable"}

    def replace(
        self, plural: str, namespace: str, name: str, body: dict[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        kind = KINDS[plural]
        current = self.find(plural, namespace, name)
        metadata = body.get("metadata") or {}
        if metadata.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        wanted = metadata.get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.qualified} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again",
                {"name": name, "group": kind.group, "kind": kind.plural},
            )
        if subresource == "status":
            updated = {**current, "status": json.loads(json.dumps(body.get("status") or {}))}
        else:
            updated = json.loads(json.dumps(body))
            updated["apiVersion"], updated["kind"] = kind.api_version, kind.kind
            kept = {k: current["metadata"][k] for k in ("uid", "creationTimestamp", "namespace", "name")}
            updated.setdefault("metadata", {}).update(kept)
            if "deletionTimestamp" in current["metadata"]:
                updated["metadata"]["deletionTimestamp"] = current["metadata"]["deletionTimestamp"]
            if "status" in current:
                updated["status"] = current["status"]
            if plural == "secrets":
                self._default_secrets(updated)
            if plural == "jobs" and updated.get("spec") != current.get("spec"):
                updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
            problems = self._validate(kind, updated)
            if problems:
                raise _invalid(kind, name, problems)
        self.objects[(plural, namespace, name)] = updated
        self._bump(updated)
        return updated

    def delete(
        self,
        plural: str,
        namespace: str,
        name: str,
        *,
        propagation: str | None = None,
        grace_seconds: int | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """Delete (or start deleting) an object; the object if it still exists (graceful), else None."""
        kind = KINDS[plural]
        obj = self.find(plural, namespace, name)
        for key in ("uid", "resourceVersion"):
            if preconditions and preconditions.get(key) and preconditions[key] != obj["metadata"].get(key):
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.qualified} "{name}": Precondition failed: '
                    f"{key} in precondition: {preconditions[key]}, "
                    f"{key} in object meta: {obj['metadata'].get(key)}",
                )
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(400, "BadRequest", f'unsupported propagationPolicy "{propagation}"')
        propagation = propagation or ("Orphan" if plural == "jobs" else "Background")
        uid = obj["metadata"]["uid"]
        if propagation == "Orphan":
            for dependent in self._dependents(namespace, uid):
                dependent["metadata"]["ownerReferences"] = [
                    ref for ref in dependent["metadata"]["ownerReferences"] if ref.get("uid") != uid
                ]
                self._bump(dependent)
        elif propagation == "Foreground":
            self._collect(namespace, uid)
        if plural == "pods" and uid in self.containers:
            default_grace = obj["spec"].get("terminationGracePeriodSeconds", 30)
            pod_grace = default_grace if grace_seconds is None else grace_seconds
        else:
            pod_grace = 0
        if pod_grace > 0:
            if "deletionTimestamp" not in obj["metadata"]:
                obj["metadata"]["deletionTimestamp"] = _now()
                obj["metadata"]["deletionGracePeriodSeconds"] = pod_grace
                self._bump(obj)
            return obj
        self._remove(plural, namespace, name)
        if propagation == "Background":
            self._collect(namespace, uid)
        return None

    def _remove(self, plural: str, namespace: str, name: str) -> None:
        obj = self.objects.pop((plural, namespace, name), None)
        if obj is not None:
            self._bump(obj)

    def _dependents(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        return [
            obj
            for (_, ns, _), obj in list(self.objects.items())
            if ns == namespace
            and any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])
        ]

    def _collect(self, namespace: str, uid: str) -> None:
        """The garbage collector: delete what ``uid`` owns (in the background, as its default)."""
        for dependent in self._dependents(namespace, uid):
            plural = next(k.plural for k in KINDS.values() if k.kind == dependent["kind"])
            with contextlib.suppress(ApiError):
                self.delete(plural, namespace, dependent["metadata"]["name"], propagation="Background")

    def event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str, component: str
    ) -> None:
        """Record an event, aggregating repeats (count, lastTimestamp) as the event recorder does."""
        meta = involved["metadata"]
        for existing in self.items("events", meta["namespace"]):
            ref = existing["involvedObject"]
            if ref["uid"] == meta["uid"] and existing["reason"] == reason and existing["message"] == message:
                existing["count"] += 1
                existing["lastTimestamp"] = _now()
                self._bump(existing)
                return
        now = _now()
        self.create(
            "events",
            meta["namespace"],
            {
                "metadata": {"name": f"{meta['name']}.{secrets.token_hex(8)}"},
                "involvedObject": {
                    "apiVersion": involved["apiVersion"],
                    "kind": involved["kind"],
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "type": type_,
                "reason": reason,
                "message": message,
                "source": {"component": component},
                "reportingComponent": component,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )

    def service_account(self, token: str) -> tuple[str, str] | None:
        """(namespace, name) of the service account a projected token belongs to, while its pod exists."""
        bound = self.tokens.get(token)
        if bound is None:
            return None
        namespace, name, pod_uid = bound
        alive = any(
            obj["metadata"]["uid"] == pod_uid for obj in self.items("pods", namespace) if obj.get("spec")
        )
        return (namespace, name) if alive else None

    def _project_service_account(self, pod: Mapping[str, Any], pod_dir: Path) -> tuple[Path, dict[str, str]]:
        """The kubelet's service account volume and Service variables for a pod: a bound token for its
        service account, the cluster CA and its namespace in a directory (standing in for the mount at
        ``SERVICE_ACCOUNT_MOUNT``), a kubeconfig equal to what client-go's InClusterConfig builds from
        them, and ``KUBERNETES_SERVICE_HOST``/``PORT`` (the in-cluster endpoint)."""
        assert self.in_cluster is not None
        namespace = pod["metadata"]["namespace"]
        account = pod["spec"].get("serviceAccountName") or "default"
        directory = pod_dir / "serviceaccount"
        directory.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        self.tokens[token] = (namespace, account, pod["metadata"]["uid"])
        files = {"token": token, "ca.crt": self.in_cluster.ca_pem.decode(), "namespace": namespace}
        for name, text in files.items():
            (directory / name).write_text(text)
        server = f"https://{self.in_cluster.host}:{self.in_cluster.port}"
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "in-cluster",
                    "cluster": {"server": server, "certificate-authority": str(directory / "ca.crt")},
                }
            ],
            "users": [{"name": account, "user": {"tokenFile": str(directory / "token")}}],
            "contexts": [
                {
                    "name": "in-cluster",
                    "context": {"cluster": "in-cluster", "user": account, "namespace": namespace},
                }
            ],
            "current-context": "in-cluster",
        }
        (directory / "kubeconfig").write_text(json.dumps(kubeconfig, indent=2))
        service = {
            "KUBERNETES_SERVICE_HOST": self.in_cluster.host,
            "KUBERNETES_SERVICE_PORT": str(self.in_cluster.port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.in_cluster.port),
        }
        return directory, service

    # --- controllers --------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), self.tick_seconds)
            self.changed.clear()
            self.reconcile()

    def reconcile(self) -> None:
        for job in self.items("jobs"):
            self._sync_job(job)
        for pod in self.items("pods"):
            self._schedule(pod)
            if self.kubelet:
                self._sync_pod(pod)

    def _owned_pods(self, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [
            pod
            for pod in self._dependents(job["metadata"]["namespace"], job["metadata"]["uid"])
            if pod["kind"] == "Pod"
        ]

    def _sync_job(self, job: dict[str, Any]) -> None:
        status = job.setdefault("status", {})
        spec = job["spec"]
        conditions = status.get("conditions") or []
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions):
            ttl = spec.get("ttlSecondsAfterFinished")
            finished = status.get("completionTime") or next(
                (c["lastTransitionTime"] for c in conditions if c["type"] == "Failed"), None
            )
            if ttl is not None and finished and time.time() - _parse_time(finished) >= ttl:
                self.delete(
                    "jobs", job["metadata"]["namespace"], job["metadata"]["name"], propagation="Background"
                )
            return
        pods = self._owned_pods(job)
        failed = sum(1 for p in pods if p["status"].get("phase") == "Failed")
        succeeded = sum(1 for p in pods if p["status"].get("phase") == "Succeeded")
        active = [p for p in pods if p["status"].get("phase") not in ("Failed", "Succeeded")]
        ready = sum(
            1
            for p in active
            for c in p["status"].get("conditions") or []
            if c["type"] == "Ready" and c["status"] == "True"
        )
        new = {**status, "active": len(active), "failed": failed, "succeeded": succeeded, "ready": ready}
        now = _now()
        if succeeded >= spec.get("completions", 1):
            new["conditions"] = [
                _condition(
                    "SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"
                ),
                _condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods"),
            ]
            new["completionTime"] = now
            self.event(job, "Normal", "Completed", "Job completed", "job-controller")
        elif failed > spec.get("backoffLimit", 6):
            message = "Job has reached the specified backoff limit"
            new["conditions"] = [
                _condition("FailureTarget", "BackoffLimitExceeded", message),
                _condition("Failed", "BackoffLimitExceeded", message),
            ]
            self.event(job, "Warning", "BackoffLimitExceeded", message, "job-controller")
        elif not active and not spec.get("suspend"):
            pod = self._create_pod(job)
            new["startTime"] = status.get("startTime") or now
            new["active"] = 1
            self.event(
                job, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}", "job-controller"
            )
        if new != status:
            job["status"] = new
            self._bump(job)

    def _create_pod(self, job: Mapping[str, Any]) -> dict[str, Any]:
        template = json.loads(json.dumps(job["spec"]["template"]))
        metadata = template.get("metadata") or {}
        metadata.pop("name", None)
        metadata["generateName"] = f"{job['metadata']['name']}-"
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": job["metadata"]["name"],
                "uid": job["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        return self.create(
            "pods",
            job["metadata"]["namespace"],
            {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]},
        )

    def _schedule(self, pod: dict[str, Any]) -> None:
        if pod["spec"].get("nodeName") or pod["status"].get("phase") != "Pending":
            return
        if not self.schedulable:
            if not any(c.get("reason") == "Unschedulable" for c in pod["status"].get("conditions") or []):
                pod["status"]["conditions"] = [
                    _condition("PodScheduled", "Unschedulable", self.unschedulable_message, status="False")
                ]
                self._bump(pod)
                self.event(
                    pod, "Warning", "FailedScheduling", self.unschedulable_message, "default-scheduler"
                )
            return
        pod["spec"]["nodeName"] = NODE_NAME
        pod["status"]["conditions"] = [_condition("PodScheduled", None, None)]
        self._bump(pod)
        meta = pod["metadata"]
        self.event(
            pod,
            "Normal",
            "Scheduled",
            f"Successfully assigned {meta['namespace']}/{meta['name']} to {NODE_NAME}",
            "default-scheduler",
        )

    # --- kubelet ------------------------------------------------------------------------------------

    def _sync_pod(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if pod["spec"].get("nodeName") != NODE_NAME:
            return
        if pod["metadata"].get("deletionTimestamp"):
            container = self.containers.get(uid)
            if container is not None and container.waiter is None:
                grace = pod["metadata"].get("deletionGracePeriodSeconds", 30)
                container.waiter = self._spawn(self._terminate(pod, container, grace))
            elif container is None:
                self._remove("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
                self._collect(pod["metadata"]["namespace"], uid)
            return
        if uid in self.containers or pod["status"].get("phase") != "Pending":
            return
        spec = _main(pod)
        try:
            argv, env = self._prepare(pod, spec)
        except ContainerError as exc:
            self._waiting(pod, spec, exc.reason, exc.message, exc.events)
            return
        pod_dir = self.work_dir / "pods" / uid
        pod_dir.mkdir(parents=True, exist_ok=True)
        log = pod_dir / f"{spec['name']}.log"
        # Reserve the slot first, so the next reconcile does not start it twice.
        self.containers[uid] = Container(log=log, started_at=_now())
        self._spawn(self._start(pod, spec, argv, env, pod_dir, log))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def _waiting(
        self,
        pod: dict[str, Any],
        spec: Mapping[str, Any],
        reason: str,
        message: str,
        events: list[tuple[str, str]],
    ) -> None:
        """The container cannot be created (yet); events only on a change, the kubelet retries quietly."""
        state = {"waiting": {"reason": reason, "message": message}}
        statuses = [_container_status(spec, state, ready=False)]
        if pod["status"].get("containerStatuses") == statuses:
            return
        pod["status"]["containerStatuses"] = statuses
        self._bump(pod)
        for event_reason, event_message in events:
            self.event(pod, "Warning", event_reason, event_message, "kubelet")

    def _image(self, name: str) -> LocalImage | None:
        """By exact reference, else by repository (tag or digest ignored)."""
        if name in self.images:
            return self.images[name]
        repository = name.split("@", 1)[0]
        if ":" in repository.rsplit("/", 1)[-1]:
            repository = repository.rsplit(":", 1)[0]
        return self.images.get(repository)

    def _prepare(self, pod: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[list[str], dict[str, str]]:
        image_name = spec.get("image", "")
        image = self._image(image_name)
        if not spec.get("command") and image is None:
            message = f'Failed to pull image "{image_name}": the stand-in kubelet has no local image for it'
            raise ContainerError(
                "ErrImagePull", message, [("Failed", message), ("Failed", "Error: ErrImagePull")]
            )
        env: dict[str, str] = dict(image.env) if image else {}
        pod_dir = self.work_dir / "pods" / pod["metadata"]["uid"]
        for mount in spec.get("volumeMounts") or []:
            variable = image.mount_env.get(mount["mountPath"]) if image else None
            if variable:
                local = pod_dir / "volumes" / mount["name"]
                local.mkdir(parents=True, exist_ok=True)
                env[variable] = str(local)
        service: dict[str, str] = {}
        if self.in_cluster is not None and pod["spec"].get("automountServiceAccountToken") is not False:
            directory, service = self._project_service_account(pod, pod_dir)
            if image is not None and SERVICE_ACCOUNT_MOUNT in image.mount_env:
                env[image.mount_env[SERVICE_ACCOUNT_MOUNT]] = str(directory)
            if image is not None and image.in_cluster_kubeconfig_env:
                env[image.in_cluster_kubeconfig_env] = str(directory / "kubeconfig")
        # The Service variables come first: the container's own may refer to them, $(VAR), and win.
        container_env = {**service, **self._container_env(pod, spec, service)}
        env.update(container_env)
        command = [
            _expand(part, container_env) for part in spec.get("command") or (image.argv if image else [])
        ]
        args = [_expand(part, container_env) for part in spec.get("args") or []]
        return [*command, *args], env

    def _container_env(
        self, pod: Mapping[str, Any], spec: Mapping[str, Any], service: Mapping[str, str]
    ) -> dict[str, str]:
        namespace = pod["metadata"]["namespace"]
        env: dict[str, str] = dict(service)
        for source in spec.get("envFrom") or []:
            ref = source.get("secretRef")
            if ref is None:
                continue
            secret = self.objects.get(("secrets", namespace, ref["name"]))
            if secret is None:
                if ref.get("optional"):
                    continue
                raise _config_error(f'secret "{ref["name"]}" not found')
            for key, value in (secret.get("data") or {}).items():
                env[source.get("prefix", "") + key] = base64.b64decode(value).decode()
        for var in spec.get("env") or []:
            if "valueFrom" not in var:
                env[var["name"]] = _expand(var.get("value", ""), env)
                continue
            value_from = var["valueFrom"]
            if "secretKeyRef" in value_from:
                ref = value_from["secretKeyRef"]
                secret = self.objects.get(("secrets", namespace, ref["name"]))
                data = (secret or {}).get("data") or {}
                if secret is None or ref["key"] not in data:
                    if ref.get("optional"):
                        continue
                    if secret is None:
                        raise _config_error(f'secret "{ref["name"]}" not found')
                    raise _config_error(f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
                env[var["name"]] = base64.b64decode(data[ref["key"]]).decode()
            elif "fieldRef" in value_from:
                path = value_from["fieldRef"]["fieldPath"]
                env[var["name"]] = "127.0.0.1" if path == "status.podIP" else _field_value(pod, path)
            else:
                raise _config_error(f"{next(iter(value_from))} is not supported by the stand-in kubelet")
        return env

    async def _start(
        self,
        pod: dict[str, Any],
        spec: Mapping[str, Any],
        argv: list[str],
        env: dict[str, str],
        pod_dir: Path,
        log: Path,
    ) -> None:
        uid = pod["metadata"]["uid"]
        try:
            with open(log, "wb") as output:  # noqa: ASYNC230 - a local file in a test helper
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    env=env,
                    cwd=pod_dir,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=output,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as exc:
            self.containers.pop(uid, None)
            message = (
                f"failed to create containerd task: exec: {argv[0] if argv else ''}: {exc.strerror or exc}"
            )
            self._finish(pod, spec, exit_code=128, reason="StartError", message=message, started_at=_now())
            self.event(pod, "Warning", "Failed", f"Error: {message}", "kubelet")
            return
        container = self.containers.setdefault(uid, Container(log=log, started_at=_now()))
        container.process, container.started_at = process, _now()
        image = spec.get("image", "")
        self.event(
            pod, "Normal", "Pulled", f'Container image "{image}" already present on machine', "kubelet"
        )
        self.event(pod, "Normal", "Created", f"Created container: {spec['name']}", "kubelet")
        self.event(pod, "Normal", "Started", f"Started container {spec['name']}", "kubelet")
        current = self._current(pod)
        if current is not None:
            current["status"].update(
                phase="Running",
                podIP="127.0.0.1",
                hostIP="127.0.0.1",
                startTime=pod["status"].get("startTime") or container.started_at,
                conditions=[
                    _condition("PodScheduled", None, None),
                    _condition("Initialized", None, None),
                    _condition("ContainersReady", None, None),
                    _condition("Ready", None, None),
                ],
                containerStatuses=[
                    _container_status(spec, {"running": {"startedAt": container.started_at}}, ready=True)
                ],
            )
            self._bump(current)
        code: int = await process.wait()
        if code < 0:
            code = 128 - code  # killed by a signal: the runtime reports 128 + signal
        policy = spec.get("terminationMessagePolicy", "File")
        tail = _log_tail(log) if policy == "FallbackToLogsOnError" and code != 0 else None
        reason = "Completed" if code == 0 else "Error"
        self._finish(pod, spec, exit_code=code, reason=reason, message=tail, started_at=container.started_at)
        if container.waiter is None:
            self.containers.pop(uid, None)

    def _current(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored version of ``pod`` (a replace swaps the object), or None once it is gone."""
        meta = pod["metadata"]
        current = self.objects.get(("pods", meta["namespace"], meta["name"]))
        return current if current is not None and current["metadata"]["uid"] == meta["uid"] else None

    def _finish(
        self,
        pod: dict[str, Any],
        spec: Mapping[str, Any],
        *,
        exit_code: int,
        reason: str,
        message: str | None,
        started_at: str,
    ) -> None:
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": started_at,
            "finishedAt": _now(),
            "containerID": f"stand-in://{pod['metadata']['uid']}",
        }
        if message:
            terminated["message"] = message
        current = self._current(pod)
        if current is None:
            return
        current["status"].update(
            phase="Succeeded" if exit_code == 0 else "Failed",
            conditions=[
                _condition("PodScheduled", None, None),
                _condition("Initialized", None, None),
                _condition("ContainersReady", "PodCompleted", None, status="False"),
                _condition("Ready", "PodCompleted", None, status="False"),
            ],
            containerStatuses=[_container_status(spec, {"terminated": terminated}, ready=False)],
        )
        self._bump(current)

    async def _terminate(self, pod: dict[str, Any], container: Container, grace: int) -> None:
        """Graceful pod deletion: SIGTERM the process group, SIGKILL after the grace period, then remove."""
        process = container.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        self.containers.pop(pod["metadata"]["uid"], None)
        self._remove("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        self._collect(pod["metadata"]["namespace"], pod["metadata"]["uid"])

    async def shutdown(self) -> None:
        """Kill every process this kubelet started (by its own pid), and reap them."""
        for container in list(self.containers.values()):
            process = container.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(process.wait(), 5)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class ContainerError(Exception):
    def __init__(self, reason: str, message: str, events: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.reason, self.message, self.events = reason, message, events


def _config_error(message: str) -> ContainerError:
    return ContainerError("CreateContainerConfigError", message, [("Failed", f"Error: {message}")])


def _condition(
    type_: str, reason: str | None, message: str | None, *, status: str = "True"
) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": type_,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": _now(),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _container_status(spec: Mapping[str, Any], state: dict[str, Any], *, ready: bool) -> dict[str, Any]:
    return {
        "name": spec["name"],
        "image": spec.get("image", ""),
        "imageID": "",
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }


def _main(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = pod["spec"]["containers"]
    return next((c for c in containers if c.get("name") == "main"), containers[0])


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` escapes, others stay."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, text)


def _log_tail(log: Path) -> str | None:
    """The last 80 lines or 2048 bytes of the log, whichever is smaller (kubelet's fallback message)."""
    try:
        data = log.read_bytes()[-TERMINATION_LOG_BYTES:]
    except OSError:
        return None
    lines = data.decode(errors="replace").splitlines()[-TERMINATION_LOG_LINES:]
    return "\n".join(lines) or None


# --- the HTTP API -----------------------------------------------------------------------------------

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[a-z0-9.-]+)/(?P<version>v[0-9a-z]+))"
    r"(?:/namespaces/(?P<namespace>[a-z0-9-]+))?/(?P<plural>[a-z]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>status|log))?)?$"
)
_DISCOVERY = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[a-z0-9.-]+)/(?P<version>v[0-9a-z]+))/?$")


def _api_resource_list(path: str) -> dict[str, Any] | None:
    """The discovery document (``APIResourceList``) of a group version this stand-in serves, None for any
    other path."""
    match = _DISCOVERY.match(path)
    if match is None:
        return None
    group_version = match["core"] or f"{match['group']}/{match['version']}"
    kinds = [kind for kind in KINDS.values() if kind.api_version == group_version]
    if not kinds:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": kind.plural,
                "singularName": kind.kind.lower(),
                "namespaced": True,
                "kind": kind.kind,
                "verbs": verbs,
            }
            for kind in kinds
        ],
    }


_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def denied_except(*allowed: tuple[str, str]) -> set[tuple[str, str]]:
    """``forbidden`` for a Role that allows only the given (verb, resource) pairs, such as seed 001's
    ``denied_except(("create", "jobs"), ("get", "jobs"))``."""
    verbs = ("get", "list", "create", "update", "patch", "delete", "deletecollection")
    return {(verb, plural) for verb in verbs for plural in KINDS} - set(allowed)


#: The user of the orchestrator's credentials (the client certificate's CN, or an accepted token).
CLIENT_USER = "platform-orchestrator"


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def _config(app: Starlette, *, lifespan: Literal["on", "off"], **tls: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        lifespan=lifespan,
        log_level="critical",
        access_log=False,
        http="h11",
        ws="none",
        loop="asyncio",
        timeout_graceful_shutdown=5,
        **tls,
    )


@dataclass(frozen=True)
class Call:
    """One request the server answered: for asserting on what a client did."""

    method: str
    path: str
    query: str
    status: int
    #: The user the request was authenticated as (before authorization), "" when it was not.
    user: str = ""
    content_type: str = ""


@dataclass(frozen=True)
class Sent:
    """An object a client sent to create (``POST``) or replace (``PUT``), as it sent it."""

    method: str
    path: str
    plural: str
    namespace: str
    body: dict[str, Any]
    dry_run: bool = False
    user: str = ""

    @property
    def kind(self) -> str:
        return KINDS[self.plural].kind

    def manifest(self) -> dict[str, Any]:
        """The object with ``apiVersion`` and ``kind`` of the endpoint where the body leaves them out."""
        kind = KINDS[self.plural]
        return {"apiVersion": kind.api_version, "kind": kind.kind, **self.body}


class _UntypedErrors:
    """Drops the Content-Type of error answers while ``api.untyped_errors`` is set."""

    def __init__(self, app: Any, api: KubeApiServer) -> None:
        self.app, self.api = app, api

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: Any) -> None:
            if (
                message["type"] == "http.response.start"
                and message["status"] >= 400
                and self.api.untyped_errors
            ):
                message = {
                    **message,
                    "headers": [(k, v) for k, v in message["headers"] if k.lower() != b"content-type"],
                }
            await send(message)

        await self.app(scope, receive, sending)


class KubeApiServer:
    """The stand-in API server (uvicorn in a thread, 127.0.0.1, a free port); see the module docstring."""

    def __init__(
        self,
        work_dir: Path,
        *,
        tls: bool = True,
        auth: Literal["client-cert", "token"] = "client-cert",
        tokens: Iterable[str] = (),
        token_review: Callable[[str], bool] | None = None,
        namespaces: Iterable[str] = ("default",),
        images: Mapping[str, LocalImage] | None = None,
        schedulable: bool = True,
        kubelet: bool = True,
        unschedulable_message: str = (
            "0/1 nodes are available: 1 Insufficient memory. preemption: 0/1 nodes are available: "
            "1 No preemption victims found for incoming pod."
        ),
        forbidden: Iterable[tuple[str, str]] = (),
        service_accounts: Mapping[str, Iterable[tuple[str, str]]] | None = None,
        in_cluster: bool = True,
        tick_seconds: float = 0.05,
        check_schemas: bool = True,
    ) -> None:
        if auth == "client-cert" and not tls:
            raise ValueError("client certificates need TLS")
        self.work_dir = work_dir
        self.tls, self.auth = tls, auth
        self.tokens = set(tokens)
        #: Webhook token authentication, as a cluster configured for a cloud's tokens does it (GKE's Google
        #: access tokens, EKS's ``k8s-aws-v1.`` tokens, AKS's Azure AD tokens): called with each bearer token
        #: not in ``tokens``; True authenticates it. It may block (it runs in a worker thread).
        self.token_review = token_review
        self.forbidden = set(forbidden)
        #: Error answers (4xx, 5xx) go out without a Content-Type header, as some proxies in front of a
        #: cluster send them (issue 26: lightkube then raised a KeyError).
        self.untyped_errors = False
        #: RBAC of service accounts (``namespace/name`` -> the (verb, resource) pairs its Roles allow):
        #: as in a real cluster, a service account may do nothing it is not granted.
        self.service_accounts = {key: set(grants) for key, grants in (service_accounts or {}).items()}
        #: Serve the in-cluster endpoint (``in_cluster_url``) and project service account tokens into pods.
        self.in_cluster = in_cluster and tls
        self.in_cluster_url = ""
        self._in_cluster_server: uvicorn.Server | None = None
        self.calls: list[Call] = []
        #: Every object a client sent to create or replace, in order (see the module docstring).
        self.sent: list[Sent] = []
        #: Check ``sent`` against Kubernetes' schemas when the ``with`` block is left without an error.
        self.check_schemas = check_schemas
        self._cluster_args: dict[str, Any] = {
            "namespaces": namespaces,
            "images": images or {},
            "schedulable": schedulable,
            "kubelet": kubelet,
            "unschedulable_message": unschedulable_message,
            "tick_seconds": tick_seconds,
        }
        self.ca = CertificateAuthority("stand-in-kubernetes-ca")
        self.client = self.ca.issue("platform-orchestrator", server=False, organization="system:masters")
        self._cluster: Cluster | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # --- kubeconfig values ---------------------------------------------------------------------------

    @property
    def ca_data(self) -> str:
        return base64.b64encode(self.ca.pem).decode()

    @property
    def client_certificate_data(self) -> str:
        return self.client.cert_data

    @property
    def client_key_data(self) -> str:
        return self.client.key_data

    # --- lifecycle -----------------------------------------------------------------------------------

    def __enter__(self) -> KubeApiServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop()
        if exc_type is None and self.check_schemas:
            self.assert_sent_valid()

    def schema_problems(self) -> list[str]:
        """``METHOD path: problem`` for each object sent that fails ``kubernetes-validate --strict``."""
        return [
            f"{sent.method} {sent.path}{' (dry run)' if sent.dry_run else ''}: {problem}"
            for sent in list(self.sent)
            for problem in schema_problems(sent.manifest())
        ]

    def assert_sent_valid(self) -> None:
        """Every object sent so far passes ``kubernetes-validate --strict`` (newest Kubernetes and 1.30)."""
        problems = self.schema_problems()
        assert not problems, "objects sent to the stand-in Kubernetes API fail its schemas:\n" + "\n".join(
            problems
        )

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        sock = _listening_socket()
        port = sock.getsockname()[1]
        tls_args: dict[str, Any] = {}
        if self.tls:
            pki = self.work_dir / "pki"
            pki.mkdir(exist_ok=True)
            serving = self.ca.issue("kube-apiserver", server=True)
            (pki / "ca.crt").write_bytes(self.ca.pem)
            (pki / "apiserver.crt").write_bytes(serving.cert_pem)
            (pki / "apiserver.key").write_bytes(serving.key_pem)
            tls_args = {"ssl_certfile": str(pki / "apiserver.crt"), "ssl_keyfile": str(pki / "apiserver.key")}
        in_cluster_sock = _listening_socket() if self.in_cluster else None
        if in_cluster_sock is not None:
            in_cluster_port = in_cluster_sock.getsockname()[1]
            self._cluster_args["in_cluster"] = InCluster("127.0.0.1", in_cluster_port, self.ca.pem)
            self.in_cluster_url = f"https://127.0.0.1:{in_cluster_port}"
        app = Starlette(
            routes=[Route("/{path:path}", self._handle, methods=list(_VERBS))],
            lifespan=self._lifespan,
        )
        app.add_middleware(_UntypedErrors, api=self)
        client_certs: dict[str, Any] = {}
        if self.auth == "client-cert":
            client_certs = {
                "ssl_ca_certs": str(self.work_dir / "pki" / "ca.crt"),
                "ssl_cert_reqs": ssl.CERT_REQUIRED,
            }
        self._server = uvicorn.Server(_config(app, lifespan="on", **tls_args, **client_certs))
        if in_cluster_sock is not None:
            # The in-cluster endpoint: the same API, the same serving certificate, service account
            # tokens only (no client certificates), started on the same loop by the lifespan.
            self._in_cluster_server = uvicorn.Server(_config(app, lifespan="off", **tls_args))
            self._in_cluster_socket = in_cluster_sock
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not self._server.started or (
            self._in_cluster_server is not None and not self._in_cluster_server.started
        ):
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the stand-in Kubernetes API server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._in_cluster_server is not None:
            self._in_cluster_server.should_exit = True
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(30)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        self._cluster = Cluster(self.work_dir, **self._cluster_args)
        controllers = asyncio.get_running_loop().create_task(self._cluster.run())
        in_cluster = None
        if self._in_cluster_server is not None:
            serve = self._in_cluster_server.serve(sockets=[self._in_cluster_socket])
            in_cluster = asyncio.get_running_loop().create_task(serve)
        try:
            yield
        finally:
            if in_cluster is not None and self._in_cluster_server is not None:
                self._in_cluster_server.should_exit = True
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(in_cluster, 10)
            controllers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await controllers
            await self._cluster.shutdown()

    # --- test-side access (thread-safe: runs on the server's loop) ----------------------------------

    def _call(self, function: Callable[[Cluster], T]) -> T:
        assert self._loop is not None and self._cluster is not None, "server not started"
        cluster = self._cluster

        async def run() -> T:
            return function(cluster)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def objects(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """A deep copy of the stored objects of a resource."""
        return self._call(lambda c: json.loads(json.dumps(c.items(plural, namespace))))

    def set_schedulable(self, schedulable: bool) -> None:
        def change(cluster: Cluster) -> None:
            cluster.schedulable = schedulable
            cluster.changed.set()

        self._call(change)

    def running_pids(self) -> list[int]:
        """Pids of the processes the kubelet runs now."""
        return self._call(
            lambda c: [
                x.process.pid
                for x in c.containers.values()
                if x.process is not None and x.process.returncode is None
            ]
        )

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            time.sleep(0.05)

    # --- requests ------------------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        user: list[str] = []
        try:
            response = await self._dispatch(request, user)
        except ApiError as exc:
            response = exc.response()
        content_type = request.headers.get("content-type", "").split(";")[0].strip()
        call = Call(
            request.method,
            request.url.path,
            request.url.query,
            response.status_code,
            "".join(user),
            content_type,
        )
        self.calls.append(call)
        return response

    def _on_in_cluster_endpoint(self, request: Request) -> bool:
        server = request.scope.get("server")
        return (
            bool(self.in_cluster_url) and server is not None and self.in_cluster_url.endswith(f":{server[1]}")
        )

    async def _authenticate(self, request: Request) -> str:
        """The user a request is from: a service account on the in-cluster endpoint, else the client."""
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else None
        if self._on_in_cluster_endpoint(request):
            cluster = self._cluster
            account = cluster.service_account(token) if cluster is not None and token else None
            if account is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            return f"system:serviceaccount:{account[0]}:{account[1]}"
        if self.auth == "client-cert":
            return CLIENT_USER  # the TLS layer required a certificate signed by the cluster CA
        if token is not None and token in self.tokens:
            return CLIENT_USER
        if token is not None and self.token_review is not None:
            if await asyncio.to_thread(self.token_review, token):
                return CLIENT_USER
        raise ApiError(401, "Unauthorized", "Unauthorized")

    async def _dispatch(self, request: Request, authenticated: list[str]) -> Response:
        path = request.url.path
        if path in ("/healthz", "/readyz", "/livez"):
            return PlainTextResponse("ok")
        user = await self._authenticate(request)
        authenticated.append(user)
        if path == "/version":
            return JSONResponse({"major": "1", "minor": "33", "gitVersion": "v1.33.0-stand-in"})
        resources = _api_resource_list(path)
        if resources is not None:
            return JSONResponse(resources)
        match = _PATH.match(path)
        kind = KINDS.get(match["plural"]) if match else None
        if (
            match is None
            or kind is None
            or (match["core"] or f"{match['group']}/{match['version']}") != kind.api_version
        ):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace, name = match["namespace"], match["name"]
        verb = _VERBS[request.method]
        if name is None and verb in ("get", "delete"):
            verb = "list" if verb == "get" else "deletecollection"
        try:
            self._authorize(user, verb, kind, namespace, name)
        except ApiError:
            if verb in ("create", "update") and namespace is not None:
                # Refused before its body is read, as the real server does; what was sent is kept all
                # the same (an unreadable body is not).
                with contextlib.suppress(ApiError):
                    body = await _body(request, kind)
                    self.sent.append(
                        Sent(request.method, path, kind.plural, namespace, body, _dry_run(request), user)
                    )
            raise
        cluster = self._cluster
        assert cluster is not None
        if verb == "list":
            if request.query_params.get("watch") in ("1", "true"):
                raise ApiError(400, "BadRequest", "watch is not implemented by this stand-in API server")
            return self._list(cluster, kind, namespace, request.query_params)
        if namespace is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if verb == "create" and name is None:
            dry_run = _dry_run(request)
            body = await _body(request, kind)
            self.sent.append(Sent("POST", path, kind.plural, namespace, copy.deepcopy(body), dry_run, user))
            created = cluster.create(kind.plural, namespace, body, dry_run=dry_run)
            return JSONResponse(created, status_code=201)
        if name is None:
            raise ApiError(
                405, "MethodNotAllowed", f"the server does not allow this method on {kind.qualified}"
            )
        return await self._object(request, cluster, kind, namespace, name, match["sub"], user)

    def _authorize(self, user: str, verb: str, kind: Kind, namespace: str | None, name: str | None) -> None:
        """RBAC stand-in, answering as the real one: the client may do all but the (verb, resource) pairs
        in ``forbidden``; a service account only what ``service_accounts`` grants it."""
        if user == CLIENT_USER:
            allowed = (verb, kind.plural) not in self.forbidden
        else:
            account = user.removeprefix("system:serviceaccount:").replace(":", "/", 1)
            allowed = (verb, kind.plural) in self.service_accounts.get(account, set())
        if allowed:
            return
        scope = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
        raise ApiError(
            403,
            "Forbidden",
            f'{kind.qualified} is forbidden: User "{user}" cannot {verb} resource '
            f'"{kind.plural}" in API group "{kind.group}"{scope}',
            {"name": name or "", "group": kind.group, "kind": kind.plural},
        )

    async def _object(
        self,
        request: Request,
        cluster: Cluster,
        kind: Kind,
        namespace: str,
        name: str,
        sub: str | None,
        user: str,
    ) -> Response:
        method = request.method
        if sub == "log":
            if kind.plural != "pods" or method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            pod = cluster.find("pods", namespace, name)
            log = self.work_dir / "pods" / pod["metadata"]["uid"] / f"{_main(pod)['name']}.log"
            return PlainTextResponse(log.read_text(errors="replace") if log.exists() else "")
        if sub == "status" and kind.plural not in ("jobs", "pods"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET":
            return JSONResponse(cluster.find(kind.plural, namespace, name))
        if method == "PUT":
            body = await _body(request, kind)
            sent = Sent("PUT", request.url.path, kind.plural, namespace, copy.deepcopy(body), user=user)
            self.sent.append(sent)
            return JSONResponse(cluster.replace(kind.plural, namespace, name, body, subresource=sub))
        if method == "PATCH":
            content_type = request.headers.get("content-type", "").split(";")[0].strip()
            if content_type != "application/merge-patch+json":
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: "
                    f"application/merge-patch+json (this stand-in does not implement {content_type})",
                )
            patched = merge_patch(cluster.find(kind.plural, namespace, name), await _json(request))
            return JSONResponse(cluster.replace(kind.plural, namespace, name, patched, subresource=sub))
        return await self._delete(request, cluster, kind, namespace, name)

    async def _delete(
        self, request: Request, cluster: Cluster, kind: Kind, namespace: str, name: str
    ) -> Response:
        params = request.query_params
        body = await request.body()
        options: dict[str, Any] = json.loads(body) if body else {}
        propagation = params.get("propagationPolicy") or options.get("propagationPolicy")
        if options.get("orphanDependents") is True and not propagation:
            propagation = "Orphan"
        grace = params.get("gracePeriodSeconds") or options.get("gracePeriodSeconds")
        remaining = cluster.delete(
            kind.plural,
            namespace,
            name,
            propagation=propagation,
            grace_seconds=int(grace) if grace is not None else None,
            preconditions=options.get("preconditions"),
        )
        if remaining is not None:  # graceful deletion under way: the object, with its deletionTimestamp
            return JSONResponse(remaining)
        details = {"name": name, "group": kind.group, "kind": kind.plural}
        return JSONResponse(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
        )

    def _list(
        self, cluster: Cluster, kind: Kind, namespace: str | None, params: Mapping[str, str]
    ) -> Response:
        items = cluster.items(kind.plural, namespace)
        if params.get("labelSelector"):
            try:
                matches = label_selector(params["labelSelector"])
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {exc}") from exc
            items = [obj for obj in items if matches(obj["metadata"].get("labels") or {})]
        if params.get("fieldSelector"):
            matches_fields = field_selector(kind, params["fieldSelector"])
            items = [obj for obj in items if matches_fields(obj)]
        metadata: dict[str, Any] = {"resourceVersion": str(cluster.resource_version)}
        start = int(base64.b64decode(params["continue"]).decode()) if params.get("continue") else 0
        limit = int(params["limit"]) if params.get("limit") else 0
        page = items[start : start + limit] if limit else items[start:]
        if limit and start + limit < len(items):
            metadata["continue"] = base64.b64encode(str(start + limit).encode()).decode()
            metadata["remainingItemCount"] = len(items) - start - limit
        # List items carry no apiVersion/kind, as the real server answers in JSON.
        body_items = [{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")} for obj in page]
        return JSONResponse(
            {
                "kind": f"{kind.kind}List",
                "apiVersion": kind.api_version,
                "metadata": metadata,
                "items": body_items,
            }
        )


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except json.JSONDecodeError as exc:
        raise ApiError(400, "BadRequest", f"the body of the request could not be decoded: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body of the request must be an object")
    return body


async def _body(request: Request, kind: Kind) -> dict[str, Any]:
    """The object a create or replace sends: JSON, or for Leases the protobuf client-go sends."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != PROTOBUF:
        return await _json(request)
    if kind.plural != "leases":
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - this stand-in decodes {PROTOBUF} for "
            "leases only",
        )
    try:
        return kube_protobuf.decode(await request.body())
    except ValueError as exc:
        raise ApiError(400, "BadRequest", f"the body of the request could not be decoded: {exc}") from exc


def _dry_run(request: Request) -> bool:
    """``?dryRun=All``: the request is checked in full and nothing is stored."""
    values = request.query_params.getlist("dryRun")
    if not values:
        return False
    if values != ["All"]:
        raise ApiError(400, "BadRequest", f'Invalid dry run value: "{values}": valid values are "All"')
    return True


def runner_image(
    env: Mapping[str, str] | None = None, *, in_cluster_kubeconfig_env: str | None = None
) -> LocalImage:
    """The runner image as a local process: ``python -m orchestrator.cli.runner``, its code dir mounted;
    ``in_cluster_kubeconfig_env``: see ``LocalImage``."""
    base = {
        k: os.environ[k] for k in ("PATH", "HOME", "LANG", "SSL_CERT_FILE", "SSL_CERT_DIR") if k in os.environ
    }
    return LocalImage(
        argv=list(RUNNER_IMAGE_ARGV),
        env={**base, **(env or {})},
        mount_env={"/opt/runner/tofu": "IAC_CODE_DIR"},
        in_cluster_kubeconfig_env=in_cluster_kubeconfig_env,
    )
