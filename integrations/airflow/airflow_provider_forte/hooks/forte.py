"""ForteHook: forte's read-only JSON API (docs/api.md, version 1) over an Airflow connection.

A daemon serves the API with ``--http ADDR`` (``forte send --watch --http 127.0.0.1:8081`` at
the edge, ``forte pull --watch --http …`` at the core, ``forte relay --http …``), and ``forte
dashboard`` over catalogues. The connection (type ``forte``) gives its host and port, the scheme
in *schema* (``http`` when empty), and the token of ``--http-token-file`` as the password, which
is sent as ``Authorization: Bearer TOKEN`` (a request from loopback needs none).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

import requests
from airflow.exceptions import AirflowException
try:
    from airflow.sdk import BaseHook
except ImportError:  # Airflow 3.0: the Task SDK's BaseHook came in 3.1
    from airflow.hooks.base import BaseHook  # type: ignore[no-redef]

from airflow_provider_forte import batches as b

# How long one request may take: the API reads the catalogue and answers at once.
REQUEST_TIMEOUT_S = 30


class ForteApiError(AirflowException):
    """A request to forte's API that failed: ``status`` is the HTTP status (None when no answer
    came: refused connection, timeout), ``error`` forte's own ``{"error": …}`` text or the
    transport's."""

    def __init__(self, method: str, url: str, status: int | None, error: str):
        self.url = url
        self.status = status
        self.error = error
        where = f"{method} {url}"
        super().__init__(f"{where}: {status} {error}" if status else f"{where}: {error}")

    @property
    def transient(self) -> bool:
        """Worth asking again while waiting: no answer (a daemon restarting), a batch not yet
        recorded (404), or a catalogue that could not be read this time (5xx). A refused token
        (401/403) or a bad parameter (400) is not."""
        return self.status is None or self.status == 404 or self.status >= 500


def base_url_of(conn: Any) -> str:
    """``http://HOST:PORT`` of a ``forte`` connection: the scheme from *schema* (default
    ``http``); a host given as a whole URL (``http://edge-1:8081``) is taken as it is."""
    host = (conn.host or "").strip().rstrip("/")
    if not host:
        raise AirflowException(f"connection {conn.conn_id!r} has no host: set the address of forte's --http")
    if "://" in host:
        return host
    scheme = (conn.schema or "http").strip() or "http"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"{scheme}://{host}:{conn.port}" if conn.port else f"{scheme}://{host}"


def _error_text(response: Any) -> str:
    """forte's ``{"error": …}`` text, or the body as it came."""
    text = response.text
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500] or getattr(response, "reason_phrase", "") or getattr(response, "reason", "")
    if isinstance(body, dict) and body.get("error"):
        return str(body["error"])
    return text.strip()[:500]


def batch_path(key: str) -> str:
    """The path of one batch: its key as it is (``SITE/ID`` keeps its slash), each part quoted."""
    return "/api/v1/batches/" + quote(key, safe="/")


class ForteHook(BaseHook):
    """forte's JSON API: ``info()``, ``batches(…)``, ``batch(key)``, ``find_batch(name, role)``,
    ``lineage(object_id)``, ``failures()`` and a few more, each answer as forte gave it (dicts
    and lists of docs/api.md). A failed request raises :class:`ForteApiError` (an
    ``AirflowException``) naming the URL and forte's error text.

    :param forte_conn_id: an Airflow connection of type ``forte``.
    """

    conn_name_attr = "forte_conn_id"
    default_conn_name = "forte_default"
    conn_type = "forte"
    hook_name = "forte"

    def __init__(self, forte_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.forte_conn_id = forte_conn_id
        self._session: requests.Session | None = None
        self._base_url: str | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["login", "extra"],
            "relabeling": {
                "host": "Host (forte's --http address)",
                "schema": "Scheme (http or https)",
                "password": "Token (--http-token-file; none needed from loopback)",
            },
            "placeholders": {"host": "127.0.0.1", "port": "8081", "schema": "http"},
        }

    def get_conn(self) -> requests.Session:
        if self._session is None:
            conn = self.get_connection(self.forte_conn_id)
            self._base_url = base_url_of(conn)
            session = requests.Session()
            session.headers["Accept"] = "application/json"
            if conn.password:
                session.headers["Authorization"] = f"Bearer {conn.password}"
            self._session = session
        return self._session

    @property
    def base_url(self) -> str:
        self.get_conn()
        assert self._base_url is not None
        return self._base_url

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """``GET path`` (``/api/v1/…``) with the parameters that are not None; the JSON answer."""
        session = self.get_conn()
        url = self.base_url + path
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = session.get(url, params=query, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as e:
            raise ForteApiError("GET", _with_query(url, query), None, f"no answer: {e}") from e
        if response.status_code != 200:
            raise ForteApiError("GET", response.url, response.status_code, _error_text(response))
        try:
            return response.json()
        except ValueError as e:
            raise ForteApiError("GET", response.url, 200, f"the answer is not JSON: {response.text[:200]!r}") from e

    # The endpoints of docs/api.md.

    def info(self) -> dict[str, Any]:
        """``GET /api/v1``: ``api``, ``forte``, ``role``, ``catalogs``."""
        return self.get("/api/v1")

    def batches(
        self,
        name: str | None = None,
        state: str | None = None,
        role: str | None = None,
        since_us: int | None = None,
        until_us: int | None = None,
        limit: int | None = None,
        site: str | None = None,
        pattern: str | None = None,
    ) -> list[dict[str, Any]]:
        """Batches, newest change first: ``name`` matches names that contain it, ``pattern``
        whole names (``run-*``, ``?``; both whatever the case), ``site`` the core's site exactly."""
        params = {
            "name": name,
            "pattern": pattern,
            "site": site,
            "state": state,
            "role": role,
            "since_us": since_us,
            "until_us": until_us,
            "limit": limit,
        }
        return self.get("/api/v1/batches", params)["batches"]

    def batch(self, key: str) -> dict[str, Any]:
        """One batch by key (``ID`` at the edge, ``SITE/ID`` at the core): ``batch``,
        ``stages``, ``files``, ``failures``."""
        return self.get(batch_path(key))

    def find_batch(
        self,
        name: str | None = None,
        role: str | None = None,
        edge_key: str | None = None,
        site: str | None = None,
        pattern: str | None = None,
    ) -> dict[str, Any] | None:
        """The newest batch named exactly ``name`` (of ``role``, of ``site`` and matching
        ``pattern`` if given), or None; ``name`` None: the newest batch of ``site`` whose name
        matches ``pattern``. With ``edge_key`` (the batch's key at the edge), a core batch whose
        key is ``SITE/edge_key`` is found too while the core has not read its name yet."""
        _check_what(name, site, pattern)
        found = self.batches(name=name, role=role, site=site, pattern=pattern)
        if name is not None and len(found) >= b.DEFAULT_LIMIT and b.select(found, name, site=site, pattern=pattern) is None:
            # More batches contain the name than one answer holds: all of them (at most 10 000).
            found = self.batches(name=name, role=role, site=site, pattern=pattern, limit=b.MAX_LIMIT)
        if edge_key and role != "edge":
            found += self.batches(name=edge_key, role=role, site=site)
        return b.select(found, name, edge_key, site=site, pattern=pattern)

    def files(
        self,
        name: str | None = None,
        state: str | None = None,
        since_us: int | None = None,
        until_us: int | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        params = {"name": name, "state": state, "since_us": since_us, "until_us": until_us, "limit": limit}
        return self.get("/api/v1/files", params)["files"]

    def lineage(self, object_id: str) -> dict[str, Any]:
        """A file's lineage: ``files``, ``parts``, ``events`` (oldest first)."""
        return self.get("/api/v1/files/" + quote(object_id, safe=""))

    def failures(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Failed attempts, newest first."""
        return self.get("/api/v1/failures", {"limit": limit})["failures"]

    def kpis(self) -> dict[str, Any]:
        return self.get("/api/v1/kpis")

    def stages(self) -> dict[str, Any]:
        return self.get("/api/v1/stages")

    def overview(self) -> dict[str, Any]:
        return self.get("/api/v1/overview")

    def failure_text(self, batch: dict[str, Any]) -> str:
        """forte's error text for a failed batch: its ``error``, else its failures' errors."""
        if batch.get("error"):
            return str(batch["error"])
        try:
            detail = self.batch(batch["key"])
        except ForteApiError as e:
            return f"(its error could not be read: {e})"
        return b.failure_text(batch, detail)

    def test_connection(self) -> tuple[bool, str]:
        try:
            info = self.info()
        except AirflowException as e:
            return False, str(e)
        return True, f"forte {info.get('forte')} ({info.get('role')}), API version {info.get('api')}"


def _check_what(name: str | None, site: str | None, pattern: str | None) -> None:
    if name is None and pattern is None:
        raise ValueError("a batch needs a name (exact) or a pattern (run-*)")


def _with_query(url: str, query: dict[str, Any]) -> str:
    return requests.Request("GET", url, params=query).prepare().url or url


class ForteAsyncClient:
    """The same GET requests for triggers, which must not block the triggerer's event loop:
    with httpx when installed (Airflow installs it), else requests in a thread."""

    def __init__(self, base_url: str, token: str | None = None) -> None:
        self.base_url = base_url
        self.headers = {"Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    @classmethod
    async def for_connection(cls, forte_conn_id: str) -> ForteAsyncClient:
        aget = getattr(BaseHook, "aget_connection", None)
        if aget is not None:
            conn = await aget(forte_conn_id)
        else:  # Airflow before 3.1
            from asgiref.sync import sync_to_async

            conn = await sync_to_async(BaseHook.get_connection)(forte_conn_id)
        return cls(base_url_of(conn), conn.password)

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        url = self.base_url + path
        query = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            import httpx
        except ImportError:
            return await asyncio.to_thread(self._get_with_requests, url, query)
        try:
            async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, headers=self.headers) as client:
                response = await client.get(url, params=query)
        except httpx.HTTPError as e:
            raise ForteApiError("GET", _with_query(url, query), None, f"no answer: {e!r}") from e
        if response.status_code != 200:
            raise ForteApiError("GET", str(response.url), response.status_code, _error_text(response))
        try:
            return response.json()
        except ValueError as e:
            raise ForteApiError("GET", str(response.url), 200, f"the answer is not JSON: {response.text[:200]!r}") from e

    def _get_with_requests(self, url: str, query: dict[str, Any]) -> Any:
        try:
            response = requests.get(url, params=query, headers=self.headers, timeout=REQUEST_TIMEOUT_S)
        except requests.RequestException as e:
            raise ForteApiError("GET", _with_query(url, query), None, f"no answer: {e}") from e
        if response.status_code != 200:
            raise ForteApiError("GET", response.url, response.status_code, _error_text(response))
        return response.json()

    async def batches(self, **params: Any) -> list[dict[str, Any]]:
        return (await self.get("/api/v1/batches", params))["batches"]

    async def batch(self, key: str) -> dict[str, Any]:
        return await self.get(batch_path(key))

    async def find_batch(
        self,
        name: str | None = None,
        role: str | None = None,
        edge_key: str | None = None,
        site: str | None = None,
        pattern: str | None = None,
    ) -> dict[str, Any] | None:
        _check_what(name, site, pattern)
        found = await self.batches(name=name, role=role, site=site, pattern=pattern)
        if name is not None and len(found) >= b.DEFAULT_LIMIT and b.select(found, name, site=site, pattern=pattern) is None:
            found = await self.batches(name=name, role=role, site=site, pattern=pattern, limit=b.MAX_LIMIT)
        if edge_key and role != "edge":
            found += await self.batches(name=edge_key, role=role, site=site)
        return b.select(found, name, edge_key, site=site, pattern=pattern)

    async def delivered_since(
        self, since_us: int, site: str | None = None, pattern: str | None = None, page: int = 1000
    ) -> list[dict[str, Any]]:
        """Every core batch ``delivered`` whose last change is at ``since_us`` or later (of
        ``site``, matching ``pattern``), oldest change first. The API answers newest first and
        at most ``limit``: a full page is followed by the next, older one (``until_us`` the
        oldest change seen, inclusive: duplicates are dropped by key)."""
        found: dict[str, dict[str, Any]] = {}
        until: int | None = None
        while True:
            rows = await self.batches(
                role="core", state="delivered", site=site, pattern=pattern, since_us=since_us, until_us=until, limit=page
            )
            for row in rows:
                found.setdefault(str(row.get("key")), row)
            if len(rows) < page:
                break
            oldest = min(int(r.get("updated_us") or 0) for r in rows)
            if until is not None and oldest >= until:
                break  # a page of one instant only: more than `page` batches changed in one microsecond
            until = oldest
        return sorted(found.values(), key=lambda r: (int(r.get("updated_us") or 0), str(r.get("key"))))

    async def failure_text(self, batch: dict[str, Any]) -> str:
        if batch.get("error"):
            return str(batch["error"])
        try:
            detail = await self.batch(batch["key"])
        except ForteApiError as e:
            return f"(its error could not be read: {e})"
        return b.failure_text(batch, detail)
