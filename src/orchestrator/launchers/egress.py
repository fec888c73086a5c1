"""Where the server may connect for a runner: the egress policy of launchers that call a runner's API.

A ``kubernetes`` runner names the URL of its cluster's API, and the orchestrator then sends requests there
with the runner's credentials. Without a policy, an organization admin could point it at the server's own
loopback services or a cloud metadata endpoint (server-side request forgery). The policy:

- requires ``https`` unless ``allow_plain_http`` (``PO_RUNNER_ALLOW_PLAIN_HTTP``);
- refuses every address in ``denied_networks`` (``PO_RUNNER_DENIED_NETWORKS``; loopback, link-local,
  "this host" and the unspecified addresses by default). An IPv4-mapped IPv6 address (``::ffff:127.0.0.1``)
  counts as its IPv4 address. Launchers check every address a host name resolves to *when they connect*,
  and connect to the address they checked, so a name that resolves elsewhere later (DNS rebinding) gains
  nothing.

The policy is the server's: an agent (``po-runner remote``) reaches its own cluster and has none.
Stdlib only, so the API can validate configurations with it without the ``kubernetes`` extra.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from orchestrator.errors import OrchestratorError

__all__ = [
    "DEFAULT_DENIED_NETWORKS",
    "EgressDeniedError",
    "EgressPolicy",
    "Network",
    "is_ip_address",
    "parse_networks",
]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: ``PO_RUNNER_DENIED_NETWORKS`` by default: "this host", loopback, link-local (cloud metadata services at
#: 169.254.169.254), and their IPv6 forms.
DEFAULT_DENIED_NETWORKS: Final = "0.0.0.0/8,127.0.0.0/8,169.254.0.0/16,::/128,::1/128,fe80::/10"


class EgressDeniedError(OrchestratorError):
    """The server may not connect there for a runner."""


def parse_networks(text: str) -> tuple[Network, ...]:
    """``"127.0.0.0/8, ::1/128"`` to networks; ValueError naming the entry that is not a network."""
    networks: list[Network] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError as exc:
            raise ValueError(f"'{entry}' is not a network in CIDR notation (e.g. 127.0.0.0/8)") from exc
    return tuple(networks)


@dataclass(frozen=True, kw_only=True)
class EgressPolicy:
    """What the server may connect to for a runner (see the module docstring)."""

    allow_plain_http: bool = False
    denied_networks: tuple[Network, ...] = parse_networks(DEFAULT_DENIED_NETWORKS)

    def denied_network(self, address: str | Address) -> Network | None:
        """The denied network ``address`` (an IP address) is in, if any."""
        ip = ipaddress.ip_address(address.split("%", 1)[0]) if isinstance(address, str) else address
        candidates: list[Address] = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            candidates.append(ip.ipv4_mapped)
        for network in self.denied_networks:
            if any(candidate.version == network.version and candidate in network for candidate in candidates):
                return network
        return None

    def check_address(self, host: str, address: str) -> None:
        """EgressDeniedError if ``address`` (what ``host`` resolved to) is in a denied network."""
        network = self.denied_network(address)
        if network is None:
            return
        shown = host if host == address else f"{host} ({address})"
        raise EgressDeniedError(
            f"{shown} is in the network {network}, which runners may not target (PO_RUNNER_DENIED_NETWORKS)"
        )

    def check_url(self, url: str, *, plain_http: bool | None = None) -> None:
        """EgressDeniedError for a URL the policy refuses before any lookup: plain ``http`` (unless
        allowed; ``plain_http`` overrides the policy's setting, for proxies) or an IP-literal host in a
        denied network. Host names are checked when connecting."""
        parts = urlsplit(url)
        scheme = (parts.scheme or "").lower()
        allow_http = self.allow_plain_http if plain_http is None else plain_http
        if scheme not in ("https", "http") or (scheme == "http" and not allow_http):
            raise EgressDeniedError(
                f"{url} is not an https URL; this server reaches runners over https only "
                "(plain http needs PO_RUNNER_ALLOW_PLAIN_HTTP=true)"
            )
        host = parts.hostname
        if not host:
            raise EgressDeniedError(f"{url} names no host")
        if is_ip_address(host):
            self.check_address(host, host)


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True
