"""Credentials for the API server, from a kubeconfig or the pod's service account, without the official
`kubernetes` package (importing any of it loads all its models: ~20 MB of resident memory).

`load_credentials(path)` reads one kubeconfig file; `load_credentials(None)` reads the files listed in
$KUBECONFIG (merged) when it is set, else the pod's service account (in-cluster). The answer is a
`Credentials`: the server URL, the `ssl.SSLContext` for it (None for http://) and `headers()`, the
Authorization header for the next request, refreshed as needed (a token file re-read every minute, an
exec plugin re-run when its credential expires or after a 401).

The rules follow client-go's `clientcmd` and `rest.InClusterConfig` (and, where they agree, the official
Python loader `kubernetes/config/kube_config.py`):

- $KUBECONFIG: files in order, missing ones skipped; for each cluster, user and context name the first
  file that has it wins, as does the first `current-context`. Relative paths (certificate files, token
  files, an exec command with a `/` in it) are resolved against the directory of the file that holds
  the entry.
- A cluster: `server`; `certificate-authority` or `certificate-authority-data` (not both), or
  `insecure-skip-tls-verify` (not with a CA); `tls-server-name`.
- A user: `token` or `tokenFile` (the file wins and is re-read every minute), or `username`/`password`
  (not with a token); `client-certificate(-data)` + `client-key(-data)`; `exec` (ExecCredential
  `client.authentication.k8s.io/v1` or `v1beta1`, token and/or client certificate, cached until its
  `expirationTimestamp`).
- In a pod: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT` (an IPv6 host in brackets), the
  service account's `token` (re-read every minute: bound tokens rotate) and `ca.crt`.

A user with an `auth-provider` (gcp, oidc, azure) is handed to the official `kubernetes.aio.config`
loader, imported only then. Every mistake is a `KubeConfigError` naming the file, the entry and the key.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime
import json
import logging
import os
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from hami_kube.errors import KubeConfigError

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
IN_CLUSTER_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
"""The variables rest.InClusterConfig reads: the API server's address, which kubelet gives every pod."""
TOKEN_REREAD_S = 60.0  # client-go's cachingTokenSource period for token files
EXEC_TIMEOUT_S = 60.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
_KINDS = (("clusters", "cluster"), ("users", "user"), ("contexts", "context"))
# Keys of a user entry that change who the client is; hami_kube does not implement them, and ignoring
# them would act as someone else, so they are refused.
_IMPERSONATION = ("as", "as-uid", "as-groups", "as-user-extra")


# --- pure: documents, merging, selection ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One named `clusters`/`users`/`contexts` item, and the file it came from."""

    name: str
    body: Mapping[str, Any]
    source: Path

    def where(self, kind: str) -> str:
        return f"kubeconfig {self.source}: {kind} {self.name!r}"

    def error(self, kind: str, key: str, problem: str) -> KubeConfigError:
        return KubeConfigError(f"{self.where(kind)}: {key}: {problem}")


@dataclass(frozen=True, slots=True)
class Kubeconfig:
    """The merge of one or more kubeconfig documents."""

    files: tuple[Path, ...]
    current_context: str = ""
    clusters: Mapping[str, Entry] = field(default_factory=dict)
    users: Mapping[str, Entry] = field(default_factory=dict)
    contexts: Mapping[str, Entry] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return "kubeconfig " + ", ".join(str(f) for f in self.files)


def merge_documents(documents: Sequence[tuple[Path, object]]) -> Kubeconfig:
    """Merge parsed kubeconfig documents in order: the first to name a cluster, user or context wins, and
    the first non-empty `current-context` (client-go's rule). An empty file is an empty document."""
    merged: dict[str, dict[str, Entry]] = {kinds: {} for kinds, _ in _KINDS}
    current = ""
    for source, document in documents:
        if document is None:
            continue
        if not isinstance(document, dict):
            raise KubeConfigError(
                f"kubeconfig {source}: not a kubeconfig (a YAML mapping), got {_kind(document)}"
            )
        for kinds, kind in _KINDS:
            items = document.get(kinds)
            if items is None:
                continue
            if not isinstance(items, list):
                raise KubeConfigError(f"kubeconfig {source}: {kinds}: not a list, got {_kind(items)}")
            seen: set[str] = set()
            for index, item in enumerate(items):
                entry = _entry(source, kinds, kind, index, item)
                if entry.name in seen:
                    raise KubeConfigError(
                        f"kubeconfig {source}: {kinds}: {kind} {entry.name!r} is listed twice"
                    )
                seen.add(entry.name)
                merged[kinds].setdefault(entry.name, entry)
        context = document.get("current-context")
        if context is not None and not isinstance(context, str):
            raise KubeConfigError(f"kubeconfig {source}: current-context: not a string, got {_kind(context)}")
        if context and not current:
            current = context
    return Kubeconfig(
        files=tuple(source for source, _ in documents),
        current_context=current,
        clusters=merged["clusters"],
        users=merged["users"],
        contexts=merged["contexts"],
    )


def _entry(source: Path, kinds: str, kind: str, index: int, item: object) -> Entry:
    if not isinstance(item, dict):
        raise KubeConfigError(f"kubeconfig {source}: {kinds}[{index}]: not a mapping, got {_kind(item)}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise KubeConfigError(f"kubeconfig {source}: {kinds}[{index}]: name: missing or not a string")
    body = item.get(kind)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise KubeConfigError(
            f"kubeconfig {source}: {kind} {name!r}: {kind}: not a mapping, got {_kind(body)}"
        )
    return Entry(name, body, source)


def _kind(value: object) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


@dataclass(frozen=True, slots=True)
class Selection:
    """The context in use and the cluster and user it names (no user: no authentication)."""

    context: Entry
    cluster: Entry
    user: Entry | None


def select(config: Kubeconfig, context: str | None = None) -> Selection:
    """The context `context` (default: the current-context) with its cluster and user."""
    name = context if context is not None else config.current_context
    if not name:
        raise KubeConfigError(f"{config.where}: current-context: not set, and no context was given")
    chosen = config.contexts.get(name)
    if chosen is None:
        key = "context" if context is not None else "current-context"
        raise KubeConfigError(f"{config.where}: {key}: no context named {name!r}")
    cluster_name = chosen.body.get("cluster")
    if not isinstance(cluster_name, str) or not cluster_name:
        raise chosen.error("context", "cluster", "missing or not a string")
    cluster = config.clusters.get(cluster_name)
    if cluster is None:
        raise chosen.error("context", "cluster", f"no cluster named {cluster_name!r}")
    user_name = chosen.body.get("user")
    if user_name is None or user_name == "":
        return Selection(chosen, cluster, None)
    if not isinstance(user_name, str):
        raise chosen.error("context", "user", f"not a string, got {_kind(user_name)}")
    user = config.users.get(user_name)
    if user is None:
        raise chosen.error("context", "user", f"no user named {user_name!r}")
    return Selection(chosen, cluster, user)


def _string(entry: Entry, kind: str, key: str) -> str | None:
    value = entry.body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise entry.error(kind, key, f"not a string, got {_kind(value)}")
    return value


def _path(entry: Entry, kind: str, key: str) -> Path | None:
    """A file path, relative ones resolved against the directory of the entry's kubeconfig."""
    value = _string(entry, kind, key)
    return None if value is None else entry.source.parent / value


def _base64(entry: Entry, kind: str, key: str) -> bytes | None:
    value = _string(entry, kind, key)
    if value is None:
        return None
    try:  # Go's decoder skips line breaks; anything else not base64 is refused
        return base64.b64decode(value.replace("\n", "").replace("\r", ""), validate=True)
    except (binascii.Error, ValueError):
        raise entry.error(kind, key, "not base64") from None


def _flag(entry: Entry, kind: str, key: str) -> bool:
    value = entry.body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise entry.error(kind, key, f"not true or false, got {_kind(value)}")
    return value


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    where: str
    server: str
    ca_file: Path | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None


def parse_cluster(entry: Entry) -> ClusterSettings:
    """The cluster's settings (no file is read). Raises KubeConfigError naming the key."""
    server = _string(entry, "cluster", "server")
    if server is None:
        raise entry.error("cluster", "server", "missing")
    if not server.startswith(("http://", "https://")) or len(server.split("://", 1)[1].strip("/")) == 0:
        raise entry.error("cluster", "server", f"{server!r} is not an http(s) URL")
    ca_file = _path(entry, "cluster", "certificate-authority")
    ca_data = _base64(entry, "cluster", "certificate-authority-data")
    if ca_file is not None and ca_data is not None:
        raise entry.error(
            "cluster", "certificate-authority-data", "given together with certificate-authority"
        )
    insecure = _flag(entry, "cluster", "insecure-skip-tls-verify")
    if insecure and (ca_file is not None or ca_data is not None):
        raise entry.error(
            "cluster",
            "insecure-skip-tls-verify",
            "true together with a certificate authority (client-go refuses it)",
        )
    proxy = _string(entry, "cluster", "proxy-url")
    if proxy is not None:
        log.warning(
            "%s: proxy-url %r is not supported by hami_kube; connecting directly",
            entry.where("cluster"),
            proxy,
        )
    return ClusterSettings(
        where=entry.where("cluster"),
        server=server.rstrip("/"),
        ca_file=ca_file,
        ca_data=ca_data,
        insecure=insecure,
        tls_server_name=_string(entry, "cluster", "tls-server-name"),
    )


@dataclass(frozen=True, slots=True)
class ExecSettings:
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = EXEC_API_VERSIONS[0]
    provide_cluster_info: bool = False
    install_hint: str = ""


@dataclass(frozen=True, slots=True)
class UserSettings:
    where: str
    token: str | None = None
    token_file: Path | None = None
    username: str | None = None
    password: str | None = None
    cert_file: Path | None = None
    cert_data: bytes | None = None
    key_file: Path | None = None
    key_data: bytes | None = None
    exec: ExecSettings | None = None
    auth_provider: str | None = None


def parse_user(entry: Entry) -> UserSettings:
    """The user's settings (no file is read). Raises KubeConfigError naming the key."""
    body = entry.body
    for key in _IMPERSONATION:
        if body.get(key):
            raise entry.error("user", key, "impersonation is not supported by hami_kube")
    token, token_file = _string(entry, "user", "token"), _path(entry, "user", "tokenFile")
    username, password = _string(entry, "user", "username"), _string(entry, "user", "password")
    if (token is not None or token_file is not None) and (username is not None or password is not None):
        raise entry.error(
            "user", "username", "given together with a token: only one authentication method is allowed"
        )
    cert_file = _path(entry, "user", "client-certificate")
    cert_data = _base64(entry, "user", "client-certificate-data")
    key_file = _path(entry, "user", "client-key")
    key_data = _base64(entry, "user", "client-key-data")
    if cert_file is not None and cert_data is not None:
        raise entry.error("user", "client-certificate-data", "given together with client-certificate")
    if key_file is not None and key_data is not None:
        raise entry.error("user", "client-key-data", "given together with client-key")
    has_cert, has_key = (
        cert_file is not None or cert_data is not None,
        key_file is not None or key_data is not None,
    )
    if has_cert != has_key:
        missing = "client-key" if has_cert else "client-certificate"
        raise entry.error("user", f"{missing}(-data)", "missing: a client certificate needs both")
    provider: str | None = None
    if body.get("auth-provider") is not None:
        spec = body["auth-provider"]
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise entry.error("user", "auth-provider", "not a mapping with a name")
        provider = spec["name"]
    exec_settings = None
    if body.get("exec") is not None:
        if provider is not None:
            raise entry.error("user", "exec", "given together with auth-provider")
        exec_settings = _parse_exec(entry)
    return UserSettings(
        where=entry.where("user"),
        token=token,
        token_file=token_file,
        username=username,
        password=password,
        cert_file=cert_file,
        cert_data=cert_data,
        key_file=key_file,
        key_data=key_data,
        exec=exec_settings,
        auth_provider=provider,
    )


def _parse_exec(entry: Entry) -> ExecSettings:
    spec = entry.body["exec"]
    if not isinstance(spec, dict):
        raise entry.error("user", "exec", f"not a mapping, got {_kind(spec)}")
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise entry.error("user", "exec.command", "missing or not a string")
    if "/" in command and not command.startswith("/"):  # client-go: relative to the kubeconfig
        command = str(entry.source.parent / command)
    api_version = spec.get("apiVersion")
    if api_version not in EXEC_API_VERSIONS:
        raise entry.error(
            "user", "exec.apiVersion", f"{api_version!r} is not one of {', '.join(EXEC_API_VERSIONS)}"
        )
    args = spec.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise entry.error("user", "exec.args", f"not a list of strings, got {_kind(args)}")
    env: list[tuple[str, str]] = []
    for index, item in enumerate(spec.get("env") or []):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise entry.error("user", f"exec.env[{index}]", "not a mapping with a name")
        value = item.get("value", "")
        if not isinstance(value, str):
            raise entry.error("user", f"exec.env[{index}].value", f"not a string, got {_kind(value)}")
        env.append((item["name"], value))
    mode = spec.get("interactiveMode") or "IfAvailable"
    if mode not in ("Never", "IfAvailable", "Always"):
        raise entry.error("user", "exec.interactiveMode", f"{mode!r} is not Never, IfAvailable or Always")
    if mode == "Always":
        raise entry.error("user", "exec.interactiveMode", "'Always' needs a terminal, and hami_kube has none")
    provide = spec.get("provideClusterInfo", False)
    if not isinstance(provide, bool):
        raise entry.error("user", "exec.provideClusterInfo", f"not true or false, got {_kind(provide)}")
    hint = spec.get("installHint") or ""
    return ExecSettings(
        command=command,
        args=tuple(args),
        env=tuple(env),
        api_version=api_version,
        provide_cluster_info=provide,
        install_hint=str(hint),
    )


@dataclass(frozen=True, slots=True)
class ExecCredential:
    """What an exec plugin answered: a token and/or a client certificate (PEM), and until when."""

    token: str | None
    cert_pem: bytes | None
    key_pem: bytes | None
    expires: float | None  # Unix time


def parse_exec_credential(output: bytes, api_version: str, where: str) -> ExecCredential:
    """Decode an exec plugin's stdout (an ExecCredential). Raises KubeConfigError."""
    try:
        document = json.loads(output)
    except ValueError as err:
        raise KubeConfigError(f"{where}: exec: the plugin's output is not JSON: {err}") from None
    if not isinstance(document, dict):
        raise KubeConfigError(f"{where}: exec: the plugin's output is not a JSON object")
    if document.get("kind") != "ExecCredential":
        raise KubeConfigError(f"{where}: exec: kind: {document.get('kind')!r}, expected 'ExecCredential'")
    if document.get("apiVersion") != api_version:
        raise KubeConfigError(
            f"{where}: exec: apiVersion: the plugin answered {document.get('apiVersion')!r}, "
            f"the kubeconfig asks for {api_version!r}"
        )
    status = document.get("status")
    if not isinstance(status, dict):
        raise KubeConfigError(f"{where}: exec: status: missing or not an object")
    token = status.get("token") or None
    cert, key = status.get("clientCertificateData") or None, status.get("clientKeyData") or None
    for name, value in (("token", token), ("clientCertificateData", cert), ("clientKeyData", key)):
        if value is not None and not isinstance(value, str):
            raise KubeConfigError(f"{where}: exec: status.{name}: not a string")
    if (cert is None) != (key is None):
        raise KubeConfigError(f"{where}: exec: status: clientCertificateData and clientKeyData come together")
    if token is None and cert is None:
        raise KubeConfigError(f"{where}: exec: status: neither a token nor clientCertificateData")
    expires: float | None = None
    stamp = status.get("expirationTimestamp")
    if stamp is not None:
        try:
            when = datetime.datetime.fromisoformat(str(stamp))
        except ValueError:
            raise KubeConfigError(
                f"{where}: exec: status.expirationTimestamp: {stamp!r} is not an RFC 3339 time"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        expires = when.timestamp()
    return ExecCredential(
        token=token,
        cert_pem=cert.encode() if cert else None,
        key_pem=key.encode() if key else None,
        expires=expires,
    )


def join_host_port(host: str, port: str) -> str:
    """Go's net.JoinHostPort: an IPv6 host goes in brackets."""
    return f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"


# --- TLS ----------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class TlsSettings:
    """What the SSL context is built from."""

    where: str
    ca_file: Path | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    server_name: str | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    user_where: str = ""

    def context(self) -> ssl.SSLContext:
        try:
            cadata = self.ca_data.decode("ascii", errors="replace") if self.ca_data is not None else None
            context = ssl.create_default_context(cafile=self.ca_file, cadata=cadata)
        except FileNotFoundError:
            raise KubeConfigError(
                f"{self.where}: certificate-authority: {self.ca_file}: no such file"
            ) from None
        except (OSError, ssl.SSLError, ValueError) as err:
            key = "certificate-authority-data" if self.ca_data is not None else "certificate-authority"
            raise KubeConfigError(f"{self.where}: {key}: not a usable PEM certificate ({err})") from None
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file is not None:
            for key, path in (("client-certificate", self.cert_file), ("client-key", self.key_file)):
                if path is not None and not path.is_file():
                    raise KubeConfigError(f"{self.user_where}: {key}: {path}: no such file")
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as err:
                problem = f"not a matching PEM certificate and key ({err})"
                raise KubeConfigError(
                    f"{self.user_where}: client-certificate/client-key: {problem}"
                ) from None
        elif self.cert_pem is not None and self.key_pem is not None:
            load_cert_from_memory(
                context,
                self.cert_pem,
                self.key_pem,
                f"{self.user_where}: client-certificate-data/client-key-data",
            )
        return context


def load_cert_from_memory(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes, where: str) -> None:
    """Load a client certificate held in memory: `ssl` only reads files, so they go to a private
    temporary directory (0700, files 0600) for the moment of loading and are removed at once."""
    with tempfile.TemporaryDirectory(prefix="hami-kube-") as directory:
        cert, key = Path(directory) / "client.crt", Path(directory) / "client.key"
        for path, data in ((cert, cert_pem), (key, key_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as err:
            raise KubeConfigError(f"{where}: not a matching PEM certificate and key ({err})") from None


# --- authentication -----------------------------------------------------------------------------------------


class Auth(Protocol):
    """Where the Authorization header comes from."""

    async def header(self) -> str | None:
        """The header's value for the next request (None: send none)."""

    async def unauthorized(self, sent: str | None) -> bool:
        """The server answered 401 to `sent`: refresh; True when a retry with the new header makes sense."""

    @property
    def current(self) -> str | None:
        """The last header handed out, without refreshing."""


class NoAuth:
    current: str | None = None

    async def header(self) -> str | None:
        return None

    async def unauthorized(self, sent: str | None) -> bool:
        return False


@dataclass(slots=True)
class StaticAuth:
    """A `token` or `username`/`password` from the kubeconfig."""

    current: str | None

    async def header(self) -> str | None:
        return self.current

    async def unauthorized(self, sent: str | None) -> bool:
        return False


class TokenFileAuth:
    """A bearer token read from a file at start and again every `reread_s` (and after a 401); when a
    re-read fails the last token stays in use (client-go's cachingTokenSource)."""

    def __init__(
        self,
        path: Path,
        where: str,
        *,
        reread_s: float = TOKEN_REREAD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path, self.where, self.reread_s, self._clock = path, where, reread_s, clock
        self.current: str | None = "Bearer " + self._read()
        self._read_at = clock()

    def _read(self) -> str:
        try:
            token = self.path.read_text().strip()
        except FileNotFoundError:
            raise KubeConfigError(f"{self.where}: {self.path}: no such file") from None
        except (OSError, UnicodeDecodeError) as err:
            raise KubeConfigError(f"{self.where}: {self.path}: cannot read: {err}") from None
        if not token:
            raise KubeConfigError(f"{self.where}: {self.path}: empty")
        return token

    def _refresh(self) -> None:
        try:
            self.current = "Bearer " + self._read()
        except KubeConfigError as err:
            log.warning("%s; keeping the token read before", err)
        self._read_at = self._clock()

    async def header(self) -> str | None:
        if self._clock() - self._read_at >= self.reread_s:
            self._refresh()
        return self.current

    async def unauthorized(self, sent: str | None) -> bool:
        self._refresh()
        return self.current != sent


class ExecAuth:
    """An exec credential plugin: run at start, then again when its credential has expired or the
    server answered 401 to it. A client certificate it gives is loaded into `tls_context` (new
    connections use it)."""

    def __init__(
        self,
        settings: ExecSettings,
        where: str,
        *,
        cluster_info: Mapping[str, Any] | None,
        tls: TlsSettings | None,
        tls_context: ssl.SSLContext | None,
        timeout_s: float = EXEC_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.where = settings, where
        self._cluster_info = cluster_info
        self._tls, self._tls_context = tls, tls_context
        self._timeout_s, self._clock = timeout_s, clock
        self._lock = asyncio.Lock()
        self._credential: ExecCredential | None = None
        self.runs = 0

    @property
    def current(self) -> str | None:
        credential = self._credential
        return f"Bearer {credential.token}" if credential is not None and credential.token else None

    def _valid(self) -> bool:
        credential = self._credential
        return credential is not None and (credential.expires is None or self._clock() < credential.expires)

    async def header(self) -> str | None:
        if not self._valid():
            async with self._lock:
                if not self._valid():
                    await self._run()
        return self.current

    async def unauthorized(self, sent: str | None) -> bool:
        async with self._lock:
            if self.current == sent:  # nobody has re-run the plugin since `sent` was handed out
                self._credential = None
                await self._run()
        return True

    async def _run(self) -> None:
        s = self.settings
        spec: dict[str, Any] = {"interactive": False}
        if s.provide_cluster_info and self._cluster_info is not None:
            spec["cluster"] = dict(self._cluster_info)
        info = {"apiVersion": s.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**os.environ, **dict(s.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}
        try:
            proc = await asyncio.create_subprocess_exec(
                s.command,
                *s.args,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as err:
            hint = f" ({s.install_hint.strip()})" if s.install_hint.strip() else ""
            raise KubeConfigError(
                f"{self.where}: exec.command: cannot run {s.command!r}: {err}{hint}"
            ) from None
        try:
            async with asyncio.timeout(self._timeout_s):
                out, err_out = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise KubeConfigError(
                f"{self.where}: exec: {s.command!r} gave no answer within {self._timeout_s:.0f} s"
            ) from None
        finally:
            self.runs += 1
        if proc.returncode != 0:
            text = err_out.decode(errors="replace").strip()[-500:]
            raise KubeConfigError(
                f"{self.where}: exec: {s.command!r} exited with {proc.returncode}"
                + (f": {text}" if text else "")
            )
        credential = parse_exec_credential(out, s.api_version, self.where)
        if credential.cert_pem is not None and credential.key_pem is not None:
            if self._tls_context is None or self._tls is None:
                log.warning(
                    "%s: exec gave a client certificate, but the server is not https; ignored", self.where
                )
            else:
                load_cert_from_memory(
                    self._tls_context, credential.cert_pem, credential.key_pem, f"{self.where}: exec"
                )
                self._tls.cert_pem, self._tls.key_pem = credential.cert_pem, credential.key_pem
        self._credential = credential


class OfficialAuth:
    """The header from an official client Configuration (the auth-provider fallback)."""

    def __init__(self, configuration: Any) -> None:
        self._configuration = configuration
        self.current: str | None = None

    async def header(self) -> str | None:
        token = await self._configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        self.current = str(token) if token else None
        return self.current

    async def unauthorized(self, sent: str | None) -> bool:
        return False


# --- credentials --------------------------------------------------------------------------------------------


class Credentials:
    """How to reach and authenticate to the API server: `server`, `ssl_context` (None for http://),
    `server_hostname` (tls-server-name) and `headers()`."""

    def __init__(
        self,
        server: str,
        *,
        source: str,
        auth: Auth,
        tls: TlsSettings | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.server = server
        self.source = source
        self.auth = auth
        self.tls = tls
        self.ssl_context = ssl_context
        self.server_hostname = tls.server_name if tls is not None else None

    async def headers(self) -> dict[str, str]:
        """The Authorization header for the next request (none without credentials). Raises
        KubeConfigError when a token cannot be had (an exec plugin failing)."""
        value = await self.auth.header()
        return {"Authorization": value} if value else {}

    async def unauthorized(self, sent: Mapping[str, str]) -> bool:
        """The server answered 401 to `sent`: refresh the credential; True when retrying makes sense."""
        return await self.auth.unauthorized(sent.get("Authorization"))


async def load_credentials(
    kubeconfig: str | Path | None,
    *,
    context: str | None = None,
    flag: str = "--kubeconfig",
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    token_reread_s: float = TOKEN_REREAD_S,
    exec_timeout_s: float = EXEC_TIMEOUT_S,
) -> Credentials:
    """Credentials from the kubeconfig file `kubeconfig`; when None, from the files in $KUBECONFIG, or in
    a pod from its service account. `flag` is how the caller's user names the file (for messages).
    Raises KubeConfigError."""
    env = os.environ if environ is None else environ
    files = _kubeconfig_files(kubeconfig, env, flag)
    if files is None:
        return in_cluster_credentials(env, service_account_dir, flag=flag, token_reread_s=token_reread_s)
    config = merge_documents([(f, _read_yaml(f)) for f in files])
    chosen = select(config, context)
    cluster = parse_cluster(chosen.cluster)
    user = parse_user(chosen.user) if chosen.user is not None else None
    if user is not None and user.auth_provider is not None:
        log.info(
            "%s: auth-provider %r is not loaded by hami_kube itself; "
            "using the official kubernetes client's loader",
            user.where,
            user.auth_provider,
        )
        return await _official_credentials(files, chosen.context.name, config.where)
    return await _credentials(cluster, user, token_reread_s=token_reread_s, exec_timeout_s=exec_timeout_s)


def _kubeconfig_files(kubeconfig: str | Path | None, env: Mapping[str, str], flag: str) -> list[Path] | None:
    """The files to merge, or None for in-cluster."""
    if kubeconfig is not None:
        path = Path(kubeconfig)
        if not path.is_file():
            raise KubeConfigError(f"kubeconfig {kubeconfig} ({flag}): no such file")
        return [path]
    if env.get("KUBECONFIG"):
        listed = [Path(p).expanduser() for p in env["KUBECONFIG"].split(os.pathsep) if p]
        files = [p for p in listed if p.is_file()]  # client-go skips the missing ones
        if not files:
            raise KubeConfigError(f"KUBECONFIG={env['KUBECONFIG']}: none of its files exists")
        return files
    return None


def _read_yaml(path: Path) -> object:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise KubeConfigError(f"kubeconfig {path}: cannot read: {err}") from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as err:
        raise KubeConfigError(f"kubeconfig {path}: not YAML: {err}") from None


async def _credentials(
    cluster: ClusterSettings, user: UserSettings | None, *, token_reread_s: float, exec_timeout_s: float
) -> Credentials:
    tls: TlsSettings | None = None
    context: ssl.SSLContext | None = None
    if cluster.server.startswith("https://"):
        tls = TlsSettings(
            where=cluster.where,
            ca_file=cluster.ca_file,
            ca_data=cluster.ca_data,
            insecure=cluster.insecure,
            server_name=cluster.tls_server_name,
        )
        if user is not None:
            tls.user_where = user.where
            tls.cert_file, tls.key_file = user.cert_file, user.key_file
            tls.cert_pem, tls.key_pem = user.cert_data, user.key_data
        context = tls.context()
    auth: Auth = NoAuth()
    if user is not None:
        if user.exec is not None:
            info: dict[str, Any] = {"server": cluster.server, "insecure-skip-tls-verify": cluster.insecure}
            if cluster.tls_server_name:
                info["tls-server-name"] = cluster.tls_server_name
            ca = cluster.ca_data
            if ca is None and cluster.ca_file is not None:
                try:
                    ca = cluster.ca_file.read_bytes()
                except OSError as err:
                    raise KubeConfigError(f"{cluster.where}: certificate-authority: {err}") from None
            if ca is not None:
                info["certificate-authority-data"] = base64.b64encode(ca).decode()
            exec_auth = ExecAuth(
                user.exec,
                user.where,
                cluster_info=info,
                tls=tls,
                tls_context=context,
                timeout_s=exec_timeout_s,
            )
            await exec_auth.header()  # a plugin that cannot answer is a start-up error
            auth = exec_auth
        elif user.token_file is not None:
            auth = TokenFileAuth(user.token_file, f"{user.where}: tokenFile", reread_s=token_reread_s)
        elif user.token is not None:
            auth = StaticAuth("Bearer " + user.token)
        elif user.username is not None or user.password is not None:
            pair = f"{user.username or ''}:{user.password or ''}".encode()
            auth = StaticAuth("Basic " + base64.b64encode(pair).decode())
    source = user.where if user is not None else cluster.where
    return Credentials(cluster.server, source=source, auth=auth, tls=tls, ssl_context=context)


def in_cluster_credentials(
    environ: Mapping[str, str],
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    *,
    flag: str = "--kubeconfig",
    token_reread_s: float = TOKEN_REREAD_S,
) -> Credentials:
    """The pod's service account (rest.InClusterConfig). Raises KubeConfigError."""
    where = f"in-cluster config (no {flag})"
    host, port = (environ.get(name, "") for name in IN_CLUSTER_ENV)
    if not host or not port:
        raise KubeConfigError(
            f"{where}: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod?); "
            f"give a kubeconfig with {flag}"
        )
    if not port.isdigit():
        raise KubeConfigError(f"{where}: KUBERNETES_SERVICE_PORT: {port!r} is not a port number")
    auth = TokenFileAuth(service_account_dir / "token", f"{where}: token", reread_s=token_reread_s)
    ca_file = service_account_dir / "ca.crt"
    try:
        if not ca_file.read_bytes().strip():
            raise KubeConfigError(f"{where}: ca.crt: {ca_file}: empty")
    except FileNotFoundError:
        raise KubeConfigError(f"{where}: ca.crt: {ca_file}: no such file") from None
    except OSError as err:
        raise KubeConfigError(f"{where}: ca.crt: {ca_file}: cannot read: {err}") from None
    tls = TlsSettings(where=f"{where}: ca.crt", ca_file=ca_file)
    server = "https://" + join_host_port(host, port)
    return Credentials(server, source=where, auth=auth, tls=tls, ssl_context=tls.context())


def context_namespace(
    kubeconfig: str | Path | None,
    *,
    context: str | None = None,
    flag: str = "--kubeconfig",
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> str:
    """The namespace a client of these credentials works in when none is named, as kubectl picks it: the
    context's `namespace`, in a pod its service account's namespace, else `default`. Raises
    KubeConfigError like `load_credentials`."""
    env = os.environ if environ is None else environ
    files = _kubeconfig_files(kubeconfig, env, flag)
    if files is None:
        try:
            return (service_account_dir / "namespace").read_text().strip() or "default"
        except OSError:
            return "default"
    chosen = select(merge_documents([(f, _read_yaml(f)) for f in files]), context)
    namespace = chosen.context.body.get("namespace")
    return namespace if isinstance(namespace, str) and namespace else "default"


async def _official_credentials(files: Sequence[Path], context: str, where: str) -> Credentials:
    """The fallback: the official loader fills a Configuration; its header is asked for each request."""
    from kubernetes.aio import config as kube_config
    from kubernetes.aio.client.configuration import Configuration

    configuration: Any = Configuration()
    loader: Any = kube_config
    try:
        await loader.load_kube_config(
            config_file=os.pathsep.join(str(f) for f in files),
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except (loader.ConfigException, OSError, ValueError, TypeError, KeyError) as err:
        raise KubeConfigError(f"{where}: the official loader failed: {err}") from None
    server = str(configuration.host or "").rstrip("/")
    tls: TlsSettings | None = None
    context_ssl: ssl.SSLContext | None = None
    if server.startswith("https://"):
        tls = TlsSettings(
            where=where,
            ca_file=Path(configuration.ssl_ca_cert) if configuration.ssl_ca_cert else None,
            insecure=not configuration.verify_ssl,
            server_name=configuration.tls_server_name,
            cert_file=Path(configuration.cert_file) if configuration.cert_file else None,
            key_file=Path(configuration.key_file) if configuration.key_file else None,
            user_where=where,
        )
        context_ssl = tls.context()
    return Credentials(
        server,
        source=where,
        auth=OfficialAuth(configuration),
        tls=tls,
        ssl_context=context_ssl,
    )


__all__ = [
    "IN_CLUSTER_ENV",
    "SERVICE_ACCOUNT_DIR",
    "ClusterSettings",
    "Credentials",
    "Entry",
    "ExecCredential",
    "ExecSettings",
    "Kubeconfig",
    "Selection",
    "UserSettings",
    "context_namespace",
    "in_cluster_credentials",
    "join_host_port",
    "load_credentials",
    "merge_documents",
    "parse_cluster",
    "parse_exec_credential",
    "parse_user",
    "select",
]
