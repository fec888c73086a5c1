"""The agent's client for the gateway's command routes; every request carries a fresh agent JWT. Built on
``client.http`` (TLS) and ``client.gateway`` (errors); its retries are the agent loop's (``agent.loop``).

Failures raise ``client.errors.ClientError`` (``retryable`` for no answer, 429 and 5xx) or ``AuthError`` for
a 401/403: the gateway does not know this key for this runner.
"""

from __future__ import annotations

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, ValidationError

from orchestrator.client.errors import ClientError
from orchestrator.client.gateway import RunnerGateway, gateway_failure, gateway_unreachable
from orchestrator.protocol import agent_auth
from orchestrator.protocol import commands as protocol

__all__ = ["AgentClient"]


class AgentClient:
    """Talks to ``{RUNNER_GATEWAY_URL}/v1/orgs/{org}/runners/{runner}/commands|events`` (``gateway``)."""

    def __init__(
        self,
        *,
        gateway: RunnerGateway,
        private_key: Ed25519PrivateKey,
        poll_timeout_seconds: float = 90.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.gateway = gateway
        self._key = private_key
        self._poll_timeout = poll_timeout_seconds
        connection = gateway.connection(user_agent="po-runner-agent")
        self._http = connection.async_client(transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    def _headers(self) -> dict[str, str]:
        token = agent_auth.sign(self._key, self.gateway.org_id, self.gateway.runner_id)
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
        path = self.gateway.path(protocol.next_command_path)
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
        return self.gateway.path(protocol.command_action_path, command_id, action)

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
        await self._post(self.gateway.path(protocol.events_path), event)
