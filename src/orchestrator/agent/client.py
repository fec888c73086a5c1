"""The agent's client for the gateway's command routes; every request carries a fresh agent JWT. Built on
``client.http`` (TLS) and ``client.gateway`` (errors); its retries are the agent loop's (``agent.loop``).

Failures raise ``client.errors.ClientError`` (``retryable`` for no answer, 429 and 5xx) or ``AuthError`` for
a 401/403: the gateway does not know this key for this runner.
"""

from __future__ import annotations

import ssl

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, ValidationError

from orchestrator.client.errors import ClientError
from orchestrator.client.gateway import gateway_connection, gateway_failure, gateway_unreachable
from orchestrator.client.tls import GatewayTls
from orchestrator.protocol import agent_auth
from orchestrator.protocol import commands as protocol

__all__ = ["AgentClient"]


class AgentClient:
    """Talks to ``{RUNNER_GATEWAY_URL}/v1/orgs/{org}/runners/{runner}/commands|events``; ``tls`` (extra CA,
    mTLS pair; ``client.tls``, the runner's too) wins over ``verify``."""

    def __init__(
        self,
        *,
        gateway_url: str,
        org_id: str,
        runner_id: str,
        private_key: Ed25519PrivateKey,
        verify: ssl.SSLContext | bool = True,
        tls: GatewayTls | None = None,
        timeout_seconds: float = 30.0,
        poll_timeout_seconds: float = 90.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        connection, self.base_path = gateway_connection(
            gateway_url, user_agent="po-runner-agent", timeout_seconds=timeout_seconds, tls=tls, verify=verify
        )
        self.org_id = org_id
        self.runner_id = runner_id
        self._key = private_key
        self._poll_timeout = poll_timeout_seconds
        self._http = connection.async_client(transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self) -> dict[str, str]:
        token = agent_auth.sign(self._key, self.org_id, self.runner_id)
        return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def _post(
        self, path: str, body: BaseModel | None, *, read_timeout: float | None = None
    ) -> httpx.Response:
        content = b"{}" if body is None else body.model_dump_json(exclude_none=True).encode()
        try:
            response = await self._http.post(
                path,
                content=content,
                headers=self._headers(),
                timeout=read_timeout if read_timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TransportError as exc:
            raise gateway_unreachable("POST", path, repr(exc)) from exc
        if response.is_success:
            return response
        raise gateway_failure("POST", path, response)

    async def next_command(self) -> protocol.NextCommand | None:
        """Long poll: the next command with its lease, or None when none came in the gateway's wait."""
        path = protocol.next_command_path(self.org_id, self.runner_id, base_path=self.base_path)
        response = await self._post(path, None, read_timeout=self._poll_timeout)
        if response.status_code == 204:
            return None
        try:
            return protocol.NextCommand.model_validate_json(response.content)
        except ValidationError as exc:
            raise ClientError(
                f"POST {path}: the gateway's answer is not a command: {exc.error_count()} problems",
                retryable=True,
            ) from exc

    def _action(self, command_id: str, action: str) -> str:
        return protocol.command_action_path(
            self.org_id, self.runner_id, command_id, action, base_path=self.base_path
        )

    async def ack(self, command_id: str, receipt: str) -> None:
        await self._post(self._action(command_id, "ack"), protocol.AckRequest(receipt=receipt))

    async def retry(self, command_id: str, receipt: str, *, delay_seconds: int) -> None:
        body = protocol.RetryRequest(receipt=receipt, delay_seconds=delay_seconds)
        await self._post(self._action(command_id, "retry"), body)

    async def reject(self, command_id: str, receipt: str, *, reason: str) -> None:
        # The gateway takes at most 4096 bytes of reason.
        cut = reason.encode()[: protocol.MAX_REJECT_REASON_BYTES].decode(errors="ignore") or "rejected"
        await self._post(
            self._action(command_id, "reject"), protocol.RejectRequest(receipt=receipt, reason=cut)
        )

    async def send_event(self, event: protocol.EventEnvelope) -> None:
        await self._post(protocol.events_path(self.org_id, self.runner_id, base_path=self.base_path), event)
