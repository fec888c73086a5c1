"""The provider's configuration and its one API session.

Each setting comes from the provider block, else its environment variable (``PO_API_URL``,
``PO_AUTH_TOKEN``, ``PO_ORG_ID``), else the octl config file (``octl_config_file``, ``$OCTL_CONFIG``
or ``~/.config/octl/config.yaml``: ``api_url``, ``token``, ``default_org_id``), as upstream's provider does.
The file is read only when it is named or a setting is still missing, and the API client (httpx and its
TLS context) is made at the first call: a provider start that only plans creates never pays for either.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pathlib import Path

    from orchestrator.client.api import ApiClient, ApiError

T = TypeVar("T")

#: What httpx and httpcore import when it is installed although the provider never uses it: httpx's
#: command line (rich, pygments), HTTP/2 (h2), SOCKS (socksio), async backends (anyio, trio). Both import
#: these optionally (a failed import is expected), and they cost an apply's provider start about 0.1 CPU-s.
OPTIONAL_IMPORTS = ("httpx._main", "h2", "socksio", "anyio", "trio")


def skip_optional_imports() -> None:
    """In the provider's own process only: make `OPTIONAL_IMPORTS` fail (``None`` in ``sys.modules``)."""
    for name in OPTIONAL_IMPORTS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def _client_class() -> type[ApiClient]:
    try:
        from orchestrator.client.api import ApiClient
    except ImportError:  # a newer httpx or httpcore that needs one of them after all
        for name in OPTIONAL_IMPORTS:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
        from orchestrator.client.api import ApiClient
    return ApiClient


#: provider attribute -> (environment variable, octl config file key)
SOURCES = {
    "api_url": ("PO_API_URL", "api_url"),
    "auth_token": ("PO_AUTH_TOKEN", "token"),
    "org_id": ("PO_ORG_ID", "default_org_id"),
}


class ProviderConfigError(Exception):
    """The provider block, its environment variables and the octl config file leave a setting unset."""


class ApiProblem(Exception):  # noqa: N818 - a diagnostic to show, named for what Terraform prints
    """An API call failed; ``summary`` and ``detail`` become the Terraform diagnostic."""

    def __init__(self, summary: str, detail: str, *, status: int = 0) -> None:
        super().__init__(f"{summary}: {detail}")
        self.summary = summary
        self.detail = detail
        self.status = status


def _octl_file(explicit: str | None, environ: Mapping[str, str]) -> Path:
    from pathlib import Path

    if explicit:
        return Path(explicit).expanduser()
    if environ.get("OCTL_CONFIG"):
        return Path(environ["OCTL_CONFIG"]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "octl" / "config.yaml"


def _octl_values(path: Path, explicit: bool) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise ProviderConfigError(f"octl_config_file: {path} does not exist") from None
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ProviderConfigError(f"octl_config_file: cannot read {path}: {exc}") from exc
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProviderConfigError(f"octl_config_file: cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def check_api_url(url: str) -> None:
    """The API URL's shape, as the API client checks it (without loading it)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProviderConfigError(f"api_url: invalid API URL '{url}': it must be http(s)://host[:port]")


@dataclass(frozen=True)
class ProviderSettings:
    api_url: str
    auth_token: str | None
    org_id: str

    @classmethod
    def resolve(cls, block: Mapping[str, Any], environ: Mapping[str, str]) -> ProviderSettings:
        """The settings from the provider block, the environment and the octl config file, in that order."""
        explicit_file = block.get("octl_config_file")
        values: dict[str, str | None] = {}
        for attribute, (variable, _key) in SOURCES.items():
            value = block.get(attribute) or environ.get(variable)
            values[attribute] = str(value) if value else None
        if explicit_file or not all(values.values()):
            octl = _octl_values(_octl_file(explicit_file, environ), bool(explicit_file))
            for attribute, (_variable, key) in SOURCES.items():
                if not values[attribute] and octl.get(key):
                    values[attribute] = str(octl[key])
        for attribute in ("api_url", "org_id"):
            if not values[attribute]:
                variable = SOURCES[attribute][0]
                raise ProviderConfigError(
                    f"{attribute} is not set: set it in the provider block, or set {variable}"
                )
        return cls(
            api_url=str(values["api_url"]), auth_token=values["auth_token"], org_id=str(values["org_id"])
        )


def _describe(exc: ApiError, action: str) -> ApiProblem:
    detail = exc.message
    fields = (exc.details or {}).get("fields") if isinstance(exc.details, dict) else None
    if fields:
        detail = f"{detail} ({fields})"
    return ApiProblem(f"{action}: {exc.kind} (HTTP {exc.status})", detail, status=exc.status)


class Session:
    """The configured API client and organization; calls run in threads, so Terraform's parallel calls
    overlap."""

    def __init__(self, settings: ProviderSettings) -> None:
        check_api_url(settings.api_url)
        self.settings = settings
        self.org = settings.org_id
        self._client: ApiClient | None = None

    @property
    def client(self) -> ApiClient:
        """The API client, made at first use."""
        if self._client is None:
            try:
                self._client = _client_class()(self.settings.api_url, self.settings.auth_token)
            except ValueError as exc:
                raise ApiProblem("invalid provider configuration", f"api_url: {exc}") from exc
        return self._client

    async def call(self, action: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(*args)`` on the client; an API error becomes an `ApiProblem` saying what was being
        done."""
        from orchestrator.client.api import ApiConnectionError, ApiError

        try:
            return await asyncio.to_thread(function, *args, **kwargs)
        except ApiConnectionError as exc:
            raise ApiProblem(f"{action}: the API cannot be reached", str(exc)) from exc
        except ApiError as exc:
            raise _describe(exc, action) from exc

    async def find(self, action: str, function: Callable[..., T], *args: Any) -> T | None:
        """Like `call`, but a 404 is ``None``: the object is gone."""
        try:
            return await self.call(action, function, *args)
        except ApiProblem as problem:
            if problem.status == 404:
                return None
            raise


_session: Session | None = None


def configure(settings: ProviderSettings) -> Session:
    global _session
    _session = Session(settings)
    return _session


def current() -> Session:
    """The session `configure` made; Terraform always configures the provider before it reads or applies."""
    if _session is None:
        raise ApiProblem(
            "provider not configured", "Terraform called a resource before configuring the provider"
        )
    return _session


def environ() -> Mapping[str, str]:
    return os.environ
