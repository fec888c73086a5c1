"""The stand-in API server's protobuf decoder (tests/support/kube_protobuf.py), on Lease bodies that
client-go in Terraform 1.15.5's kubernetes backend sent (recorded from tests/acceptance/
test_kubernetes_runner.py into tests/data/kube/) and on its own encoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import kube_protobuf

DATA = Path(__file__).parent.parent / "data" / "kube"
SUFFIX = "0bb30ca2-3c4b-4b21-b615-3cb682af992d"
LABELS = {
    "app.kubernetes.io/managed-by": "terraform",
    "tfstate": "true",
    "tfstateSecretSuffix": SUFFIX,
    "tfstateWorkspace": "default",
}


def test_decode__terraform_lock_create() -> None:
    """The Lease Terraform creates to lock: name, labels, the lock info annotation, the holder; the
    empty strings Go writes for unset ObjectMeta fields are left out, as in JSON."""
    lease = kube_protobuf.decode((DATA / "lease-create-terraform-1.15.5.pb").read_bytes())

    info = json.loads(lease["metadata"]["annotations"]["app.terraform.io/lock-info"])
    assert lease["apiVersion"] == "coordination.k8s.io/v1"
    assert lease["kind"] == "Lease"
    assert set(lease["metadata"]) == {"name", "labels", "annotations"}
    assert lease["metadata"]["name"] == f"lock-tfstate-default-{SUFFIX}"
    assert lease["metadata"]["labels"] == LABELS
    assert lease["spec"] == {"holderIdentity": info["ID"]}
    assert info["Operation"] == "init"


def test_decode__terraform_unlock_update() -> None:
    """The update that unlocks: the stored object's uid, resourceVersion and creationTimestamp come
    back, no holder and no lock info."""
    lease = kube_protobuf.decode((DATA / "lease-unlock-terraform-1.15.5.pb").read_bytes())

    assert lease["metadata"]["resourceVersion"].isdigit()
    assert lease["metadata"]["creationTimestamp"].endswith("Z")
    assert len(lease["metadata"]["uid"]) == 36
    assert "annotations" not in lease["metadata"]
    assert lease["spec"] == {}


def test_encode_lease__round_trips() -> None:
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "lock", "labels": {"a": "1"}, "annotations": {"b": "2"}},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15, "leaseTransitions": -1},
    }

    assert kube_protobuf.decode(kube_protobuf.encode_lease(lease)) == lease


@pytest.mark.parametrize(
    "data",
    [
        b'{"kind": "Lease"}',
        kube_protobuf.MAGIC + b"\x0a\x0c\x0a\x02v1\x12\x06Secret",
        kube_protobuf.MAGIC + b"\x0a",
    ],
    ids=["json", "secret", "truncated"],
)
def test_decode__refuses_what_it_does_not_know(data: bytes) -> None:
    with pytest.raises(ValueError):
        kube_protobuf.decode(data)
