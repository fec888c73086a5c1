"""``module_source``: remote modules and paths inside the bundle pass; whatever reads the disk of the
machine running the runner (the server's, for a local runner) is refused, naming the field."""

from __future__ import annotations

import pytest

from orchestrator.domain.catalogue import check_module_source
from orchestrator.errors import InvalidInputError

ALLOWED = [
    "inline",
    "terraform-aws-modules/vpc/aws",
    "terraform-aws-modules/elasticache/aws@1.2.0",
    "app.terraform.io/acme/vpc/aws",
    "registry.example.com:8443/acme/vpc/aws",
    "hashicorp/consul/aws//modules/consul-cluster",
    "github.com/hashicorp/example",
    "bitbucket.org/hashicorp/terraform-consul-aws",
    "git::https://github.com/acme/modules.git//postgres?ref=v1",
    "git::ssh://git@github.com/acme/modules.git",
    "git::git@github.com:acme/modules.git",
    "git@github.com:acme/modules.git//postgres?ref=v1.2.0",
    "https://example.com/vpc-module.zip",
    "https://example.com/vpc-module?archive=zip",
    "hg::https://example.com/vpc.hg",
    "s3::https://s3-eu-west-1.amazonaws.com/examplecorp-terraform-modules/vpc.zip",
    "gcs::https://www.googleapis.com/storage/v1/modules/foomodule.zip",
    "acme-modules.s3-eu-west-1.amazonaws.com/vpc.zip",
    "oci://example.com/repository/vpc",
    "./modules/network",
    "./shared/dns/x@y",
]

REFUSED = [
    ("../../..", "'..' path segment"),
    ("../shared/dns", "'..' path segment"),
    ("./modules/../../../etc", "'..' path segment"),
    ("./modules/%2e%2e/%2E%2E/etc", "'..' path segment"),
    ("git::https://example.com/repo.git//sub/../../..", "'..' path segment"),
    ("/etc", "absolute local path"),
    ("/var/lib/platform-orchestrator/runs", "absolute local path"),
    ("~/modules", "absolute local path"),
    ("C:/modules", "absolute local path"),
    ("C:\\modules", "backslash"),
    ("file:///etc", "reads local files"),
    ("FILE:///etc", "reads local files"),
    ("git::file:///etc", "reads local files"),
    ("git::file%3A///etc", "reads local files"),
    ("hg::file:///srv/repo", "reads local files"),
    ("https://example.com/m.zip?checksum=file:///etc/passwd", "reads local files"),
    ("git::/etc", "needs a URL after 'git::'"),
    ("git::./modules", "needs a URL after 'git::'"),
    ("smb::https://example.com/x", "uses the getter 'smb::'"),
    ("ftp://example.com/module.zip", "uses the scheme 'ftp://'"),
    ("https:///etc/passwd", "names no host"),
    ("modules/x/../..", "'..' path segment"),
    (".hidden/module", "a path in the bundle starts with './'"),
]


@pytest.mark.parametrize("source", ALLOWED)
def test_module_source__remote_and_bundle_sources_pass(source: str) -> None:
    check_module_source(source)


@pytest.mark.parametrize(("source", "why"), REFUSED)
def test_module_source__local_disk_refused_naming_the_field(source: str, why: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        check_module_source(source)

    assert caught.value.message.startswith(f"module_source: '{source}' ")
    assert why in caught.value.message
