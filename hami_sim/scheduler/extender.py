"""kube-scheduler's `HTTPExtender`: POST `<urlPrefix>/<verb>` with extender v1 JSON (Go field names,
decoded case-insensitively as Go's encoding/json does).

- TLS as kube's `makeTransport`: with `enableHTTPS` and no CA (`caFile`/`caData`) the certificate is
  not verified (kube sets Insecure); a CA together with `insecure: true` is refused; `serverName`
  overrides the name checked; `certFile`/`keyFile` or `certData`/`keyData` present a client
  certificate. An `https://` URL without `enableHTTPS` verifies against the system roots.
- Any answer but HTTP 200 is `failed <verb> with extender at URL <url>, code <n>`; a transport failure
  `Post "<url>": <why>`; a non-empty `Error` field is the error.
- Filter sends `NodeNames` (nodeCacheCapable) or a full `Nodes` NodeList; an answer naming a node that
  was not asked about is an error, as in kube. No filterVerb: every node passes.
- Prioritize without prioritizeVerb gives 0 for every node.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import tempfile
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from hami_sim.scheduler.config import ConfigError, ExtenderConfig, ExtenderTLSConfig

JSON = dict[str, Any]


class ExtenderError(Exception):
    """A failed extender call; the message is what kube-scheduler would report."""


@dataclass
class CallStats:
    """Latency of one verb's calls (seconds); `recent` keeps the last 4096 for percentiles."""

    calls: int = 0
    errors: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=4096))

    def record(self, seconds: float, ok: bool) -> None:
        self.calls += 1
        self.errors += 0 if ok else 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)
        self.recent.append(seconds)

    def snapshot(self) -> dict[str, float]:
        ordered = sorted(self.recent)

        def pct(p: float) -> float:
            return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else 0.0

        return {
            "calls": self.calls,
            "errors": self.errors,
            "mean_s": self.total_s / self.calls if self.calls else 0.0,
            "p50_s": pct(0.50),
            "p99_s": pct(0.99),
            "max_s": self.max_s,
        }


@dataclass(frozen=True, slots=True)
class FilterAnswer:
    nodes: list[str]
    """The nodes that passed, in the extender's order."""
    failed: dict[str, str]
    failed_unresolvable: dict[str, str]


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """Go's encoding/json key matching: exact, else case-insensitive."""
    if name in obj:
        return obj[name]
    lowered = name.lower()
    for key, value in obj.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


def _string_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ExtenderError(f"{what}: expected an object of strings")
    return {str(k): v for k, v in value.items()}


def _write_private(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def extender_ssl_context(config: ExtenderConfig) -> ssl.SSLContext | None:
    """The client TLS context for an https extender (None for http). Raises ConfigError naming the
    field when a file cannot be read or the settings conflict."""
    if not config.url_prefix.startswith("https://"):
        return None
    tls = config.tls or ExtenderTLSConfig()
    where = f"extenders[{config.index}].tlsConfig"
    has_ca = bool(tls.ca_file or tls.ca_data)
    insecure = tls.insecure or (config.enable_https and not has_ca)
    if tls.insecure and has_ca:
        raise ConfigError(
            f"{where}: specifying a root certificates file with the insecure flag is not allowed"
        )
    try:
        context = ssl.create_default_context(
            cafile=tls.ca_file or None, cadata=tls.ca_data.decode("ascii") if tls.ca_data else None
        )
    except (OSError, ssl.SSLError, ValueError, UnicodeDecodeError) as err:
        source = f"caFile {tls.ca_file}" if tls.ca_file else "caData"
        reason = getattr(err, "strerror", None) or err
        raise ConfigError(
            f"{where}.{source}: cannot load the CA: {reason} (--extender-ca-file overrides it)"
        ) from None
    if tls.cert_file or tls.key_file or tls.cert_data or tls.key_data:
        try:
            if tls.cert_data or tls.key_data:
                with tempfile.TemporaryDirectory(prefix="hami-ext-") as tmp:
                    cert = _write_private(tmp, "tls.crt", tls.cert_data) if tls.cert_data else tls.cert_file
                    key = _write_private(tmp, "tls.key", tls.key_data) if tls.key_data else tls.key_file
                    context.load_cert_chain(cert, key or None)
            else:
                context.load_cert_chain(tls.cert_file, tls.key_file or None)
        except (OSError, ssl.SSLError, ValueError) as err:
            raise ConfigError(f"{where}: cannot load the client certificate: {err}") from None
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class HTTPExtender:
    """One configured extender. `await open()` inside the loop that uses it; `await close()` at the end."""

    def __init__(self, config: ExtenderConfig, *, max_connections: int = 64) -> None:
        self.config = config
        self._context = extender_ssl_context(config)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.stats: dict[str, CallStats] = {
            "filter": CallStats(),
            "prioritize": CallStats(),
            "bind": CallStats(),
        }

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def is_binder(self) -> bool:
        return bool(self.config.bind_verb)

    @property
    def is_filter(self) -> bool:
        return bool(self.config.filter_verb)

    @property
    def is_prioritizer(self) -> bool:
        return bool(self.config.prioritize_verb)

    async def open(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, ssl=self._context if self._context is not None else False
            )
            self._session = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(self, stat: str, verb: str, args: Mapping[str, Any]) -> Any:
        session = self._session
        if session is None:
            raise ExtenderError(f"extender {self.name} is not open")
        url = f"{self.config.url_prefix}/{verb}"
        server_hostname = self.config.tls.server_name if self.config.tls and self._context else ""
        started = time.perf_counter()
        ok = False
        try:
            async with session.post(
                url,
                data=orjson.dumps(args),
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self.config.http_timeout_s),
                server_hostname=server_hostname or None,
            ) as response:
                body = await response.read()
                if response.status != 200:
                    raise ExtenderError(f"failed {verb} with extender at URL {url}, code {response.status}")
            try:
                answer = orjson.loads(body)
            except orjson.JSONDecodeError as err:
                raise ExtenderError(f"{verb} with extender at URL {url}: answer is not JSON: {err}") from None
            ok = True
            return answer
        except TimeoutError:
            raise ExtenderError(
                f'Post "{url}": context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
            ) from None
        except (aiohttp.ClientError, OSError) as err:
            raise ExtenderError(f'Post "{url}": {err or type(err).__name__}') from None
        finally:
            self.stats[stat].record(time.perf_counter() - started, ok)

    def _args(self, pod: JSON, nodes: Sequence[tuple[str, JSON | None]]) -> JSON:
        if self.config.node_cache_capable:
            return {"Pod": pod, "Nodes": None, "NodeNames": [name for name, _ in nodes]}
        items = [node for _, node in nodes if node is not None]
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}

    async def filter(self, pod: JSON, nodes: Sequence[tuple[str, JSON | None]]) -> FilterAnswer:
        """`nodes`: (name, Node object) of the candidates. Raises ExtenderError."""
        if not self.config.filter_verb:
            return FilterAnswer([name for name, _ in nodes], {}, {})
        answer = await self._send("filter", self.config.filter_verb, self._args(pod, nodes))
        if not isinstance(answer, dict):
            raise ExtenderError(
                f"filter with extender at URL {self.config.url_prefix}: answer is not an object"
            )
        error = _field(answer, "Error")
        if error:
            raise ExtenderError(str(error))
        asked = {name for name, _ in nodes}
        names: list[str] = []
        node_names = _field(answer, "NodeNames")
        node_list = _field(answer, "Nodes")
        if self.config.node_cache_capable and node_names is not None:
            if not isinstance(node_names, list):
                raise ExtenderError("filter answer: NodeNames is not a list")
            for name in node_names:
                if name not in asked:
                    raise ExtenderError(
                        f'extender "{self.config.url_prefix}" claims a filtered node "{name}" '
                        "which is not found in the input node list"
                    )
                names.append(str(name))
        elif node_list is not None:
            items = _field(node_list, "items") if isinstance(node_list, dict) else None
            for item in items or ():
                name = ((item or {}).get("metadata") or {}).get("name") if isinstance(item, dict) else None
                if name not in asked:
                    raise ExtenderError(
                        f'extender "{self.config.url_prefix}" claims a filtered node "{name}" '
                        "which is not found in the input node list"
                    )
                names.append(str(name))
        return FilterAnswer(
            names,
            _string_map(_field(answer, "FailedNodes"), "filter answer FailedNodes"),
            _string_map(
                _field(answer, "FailedAndUnresolvableNodes"), "filter answer FailedAndUnresolvableNodes"
            ),
        )

    async def prioritize(
        self, pod: JSON, nodes: Sequence[tuple[str, JSON | None]]
    ) -> tuple[list[tuple[str, int]], int]:
        """(host, 0..10 score) pairs and the weight. Raises ExtenderError."""
        if not self.config.prioritize_verb:
            return [(name, 0) for name, _ in nodes], 0
        answer = await self._send("prioritize", self.config.prioritize_verb, self._args(pod, nodes))
        if not isinstance(answer, list):
            raise ExtenderError("prioritize answer: not a HostPriorityList (a JSON list)")
        out: list[tuple[str, int]] = []
        for entry in answer:
            host = _field(entry, "Host") if isinstance(entry, dict) else None
            score = _field(entry, "Score") if isinstance(entry, dict) else None
            if not isinstance(host, str) or isinstance(score, bool) or not isinstance(score, int):
                raise ExtenderError(
                    f"prioritize answer: bad entry {entry!r} (want Host string, Score integer)"
                )
            out.append((host, score))
        return out, self.config.weight

    async def bind(self, pod: JSON, node: str) -> None:
        """Raises ExtenderError."""
        if not self.config.bind_verb:
            raise ExtenderError("unexpected empty bindVerb in extender")
        meta = pod.get("metadata") or {}
        args = {
            "PodName": meta.get("name", ""),
            "PodNamespace": meta.get("namespace", ""),
            "PodUID": meta.get("uid", ""),
            "Node": node,
        }
        answer = await self._send("bind", self.config.bind_verb, args)
        error = _field(answer, "Error") if isinstance(answer, dict) else None
        if error:
            raise ExtenderError(str(error))


async def close_all(extenders: Sequence[HTTPExtender]) -> None:
    await asyncio.gather(*(e.close() for e in extenders), return_exceptions=True)
