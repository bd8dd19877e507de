"""hami_kube's credentials loader end to end: a token kubeconfig against the local API server (and no
`kubernetes` module imported on the way), real HTTPS on loopback (CA file or data, client certificate
files or data, tls-server-name, insecure-skip-tls-verify), exec plugins (a Python script: cached until
expiry, re-run when expired and after a 401, a client certificate from the plugin), tokenFile re-read,
in-cluster with injected env and paths, $KUBECONFIG with two files, the auth-provider fallback, the
official Configuration built on demand, and file errors named by file, entry and key."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from hami_kube.client import KubeApi
from hami_kube.config import load_credentials
from hami_kube.errors import KubeApiError, KubeConfigError
from hami_sim.apiserver import ApiServerRunner
from hami_sim.tls import generate_ca, generate_serving_cert, server_ssl_context

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"


def kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any] | None = None) -> Path:
    context: dict[str, Any] = {"cluster": "c"}
    if user is not None:
        context["user"] = "u"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}] if user is not None else [],
        "contexts": [{"name": "ctx", "context": context}],
        "current-context": "ctx",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


# --- the peer: an aiohttp server on loopback that records who called ----------------------------------------


@dataclass
class Peer:
    url: str = ""
    seen: list[str] = field(default_factory=list)
    rejected: set[str] = field(default_factory=set)

    async def handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.seen.append(auth)
        if auth in self.rejected:
            status = {"kind": "Status", "reason": "Unauthorized", "message": "token refused"}
            return web.json_response(status, status=401)
        cert = request.transport.get_extra_info("peercert") if request.transport else None
        subject = dict(pair[0] for pair in cert["subject"]) if cert else {}
        return web.json_response({"authorization": auth, "cn": subject.get("commonName", "")})


@asynccontextmanager
async def peer(context: ssl.SSLContext | None = None) -> AsyncIterator[Peer]:
    state = Peer()
    app = web.Application()
    app.router.add_get("/{tail:.*}", state.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    state.url = f"{'https' if context else 'http'}://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class Pki:
    ca: bytes
    ca_key: bytes
    server: tuple[bytes, bytes]
    client: tuple[bytes, bytes]

    @classmethod
    def new(cls, *, dns: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = ("127.0.0.1",)) -> Pki:
        ca, ca_key = generate_ca("kube-test-ca")
        server = generate_serving_cert(ca, ca_key, list(dns), list(ips), common_name="apiserver")
        client = generate_serving_cert(ca, ca_key, ["admin"], common_name="admin")
        return cls(ca, ca_key, server, client)

    def mtls(self) -> ssl.SSLContext:
        return server_ssl_context(*self.server, client_ca_pem=self.ca)

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in (
            ("ca.crt", self.ca),
            ("client.crt", self.client[0]),
            ("client.key", self.client[1]),
        ):
            (directory / name).write_bytes(data)


def b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


# --- the local API server, a bearer token, no `kubernetes` --------------------------------------------------


def test_token_kubeconfig_creates_and_reads_objects_on_the_local_api_server(tmp_path: Path) -> None:
    with ApiServerRunner() as server:
        path = server.write_kubeconfig(tmp_path / "kubeconfig")

        async def main() -> None:
            async with await KubeApi.connect(path) as api:
                assert api.host == server.base_url
                assert api.credentials is not None
                assert await api.credentials.headers() == {"Authorization": "Bearer hami-sim-token"}
                body = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "a"},
                    "data": {"k": "v"},
                }
                await api.request("POST", "/api/v1/namespaces/default/configmaps", body)
                got = await api.get("/api/v1/namespaces/default/configmaps/a")
                assert got["data"] == {"k": "v"}

        run(main)


def test_connecting_with_a_token_kubeconfig_imports_no_kubernetes_module(tmp_path: Path) -> None:
    code = (
        "import asyncio, sys\n"
        "from hami_kube.client import KubeApi\n"
        "async def main():\n"
        "    async with await KubeApi.connect(sys.argv[1]) as api:\n"
        "        await api.get('/api/v1/namespaces')\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')))\n"
    )
    with ApiServerRunner() as server:
        path = server.write_kubeconfig(tmp_path / "kubeconfig")
        out = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60, check=True
        )
    assert out.stdout.strip() == "[]"


# --- HTTPS --------------------------------------------------------------------------------------------------


def test_https_with_ca_and_client_certificate_files_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    pki = Pki.new()
    pki.write(tmp_path / "pki")

    async def main() -> None:
        async with peer(pki.mtls()) as server:
            cluster = {"server": server.url, "certificate-authority": "pki/ca.crt"}
            user = {"client-certificate": "pki/client.crt", "client-key": "pki/client.key"}
            async with await KubeApi.connect(kubeconfig(tmp_path / "kubeconfig", cluster, user)) as api:
                assert await api.get("/api/v1/namespaces") == {"authorization": "", "cn": "admin"}

    run(main)


def test_https_with_ca_and_client_certificate_data_authenticates_with_the_certificate(tmp_path: Path) -> None:
    pki = Pki.new()

    async def main() -> None:
        async with peer(pki.mtls()) as server:
            cluster = {"server": server.url, "certificate-authority-data": b64(pki.ca)}
            user = {
                "client-certificate-data": b64(pki.client[0]),
                "client-key-data": b64(pki.client[1]),
                "token": "and-a-token",
            }
            async with await KubeApi.connect(kubeconfig(tmp_path / "kubeconfig", cluster, user)) as api:
                answer = await api.get("/api/v1/namespaces")
                assert answer == {"authorization": "Bearer and-a-token", "cn": "admin"}

    run(main)


def test_username_and_password_are_sent_as_basic_auth(tmp_path: Path) -> None:
    async def main() -> None:
        async with peer() as server:
            user = {"username": "admin", "password": "s3cret"}
            async with await KubeApi.connect(
                kubeconfig(tmp_path / "kubeconfig", {"server": server.url}, user)
            ) as api:
                assert (await api.get("/"))["authorization"] == "Basic YWRtaW46czNjcmV0"

    run(main)


def test_https_without_the_right_ca_fails_as_a_transport_error_and_insecure_skip_tls_verify_connects(
    tmp_path: Path,
) -> None:
    pki, other = Pki.new(), Pki.new()

    async def main() -> None:
        async with peer(server_ssl_context(*pki.server)) as server:
            wrong = {"server": server.url, "certificate-authority-data": b64(other.ca)}
            async with await KubeApi.connect(kubeconfig(tmp_path / "wrong", wrong)) as api:
                with pytest.raises(KubeApiError) as info:
                    await api.get("/api/v1/namespaces")
                assert info.value.status == 0 and "certificate verify failed" in info.value.message
            insecure = {"server": server.url, "insecure-skip-tls-verify": True}
            async with await KubeApi.connect(kubeconfig(tmp_path / "insecure", insecure)) as api:
                assert (await api.get("/"))["authorization"] == ""

    run(main)


def test_tls_server_name_is_the_name_the_server_certificate_is_checked_against(tmp_path: Path) -> None:
    pki = Pki.new(dns=("kube.internal",), ips=())  # no IP address in the certificate

    async def main() -> None:
        async with peer(server_ssl_context(*pki.server)) as server:
            named = {
                "server": server.url,
                "certificate-authority-data": b64(pki.ca),
                "tls-server-name": "kube.internal",
            }
            async with await KubeApi.connect(kubeconfig(tmp_path / "named", named)) as api:
                assert (await api.get("/"))["cn"] == ""
            unnamed = {"server": server.url, "certificate-authority-data": b64(pki.ca)}
            async with await KubeApi.connect(kubeconfig(tmp_path / "unnamed", unnamed)) as api:
                with pytest.raises(KubeApiError) as info:
                    await api.get("/")
                assert info.value.status == 0 and "127.0.0.1" in info.value.message

    run(main)


# --- exec plugins -------------------------------------------------------------------------------------------

PLUGIN = """#!{python}
import json, os, sys
log = os.environ["PLUGIN_LOG"]
with open(log, "a") as out:
    info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
    out.write(json.dumps({{"info": info, "args": sys.argv[1:]}}) + "\\n")
runs = sum(1 for _ in open(log))
if os.environ.get("PLUGIN_FAIL"):
    sys.stderr.write("cannot reach the identity provider\\n")
    sys.exit(3)
status = {{"token": "tok-%d" % runs}}
expiry = os.environ.get("PLUGIN_EXPIRY")
if expiry:
    status["expirationTimestamp"] = expiry
if os.environ.get("PLUGIN_CERT"):
    status = {{"clientCertificateData": open(os.environ["PLUGIN_CERT"]).read(),
               "clientKeyData": open(os.environ["PLUGIN_KEY"]).read()}}
print(json.dumps({{"apiVersion": os.environ["PLUGIN_API"], "kind": "ExecCredential", "status": status}}))
"""


def plugin_user(tmp_path: Path, api_version: str = V1, **env: str) -> dict[str, Any]:
    script = tmp_path / "bin" / "plugin"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(PLUGIN.format(python=sys.executable))
    script.chmod(0o755)
    variables = {"PLUGIN_LOG": str(tmp_path / "runs.log"), "PLUGIN_API": api_version, **env}
    return {
        "exec": {
            "apiVersion": api_version,
            "command": "./bin/plugin",  # relative to the kubeconfig's directory
            "args": ["--cluster", "one"],
            "env": [{"name": k, "value": v} for k, v in variables.items()],
            "provideClusterInfo": True,
            "interactiveMode": "Never",
        }
    }


def plugin_runs(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "runs.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_exec_token_is_cached_until_its_expiry_and_the_plugin_gets_args_env_and_exec_info(
    tmp_path: Path,
) -> None:
    user = plugin_user(tmp_path, PLUGIN_EXPIRY="2999-01-01T00:00:00Z")

    async def main() -> None:
        async with peer() as server:
            async with await KubeApi.connect(
                kubeconfig(tmp_path / "kubeconfig", {"server": server.url}, user)
            ) as api:
                await api.get("/a")
                await api.get("/b")
            assert server.seen == ["Bearer tok-1", "Bearer tok-1"]
            runs = plugin_runs(tmp_path)
            assert len(runs) == 1 and runs[0]["args"] == ["--cluster", "one"]
            assert runs[0]["info"] == {
                "apiVersion": V1,
                "kind": "ExecCredential",
                "spec": {
                    "interactive": False,
                    "cluster": {"server": server.url, "insecure-skip-tls-verify": False},
                },
            }

    run(main)


def test_exec_plugin_runs_again_once_its_token_has_expired(tmp_path: Path) -> None:
    user = plugin_user(tmp_path, V1BETA1, PLUGIN_EXPIRY="2000-01-01T00:00:00Z")

    async def main() -> None:
        async with peer() as server:
            async with await KubeApi.connect(
                kubeconfig(tmp_path / "kubeconfig", {"server": server.url}, user)
            ) as api:
                await api.get("/a")
                await api.get("/b")
            assert server.seen == ["Bearer tok-2", "Bearer tok-3"]  # run 1 at connect, expired already
            assert len(plugin_runs(tmp_path)) == 3

    run(main)


def test_a_401_reruns_the_exec_plugin_and_retries_the_call_once_with_the_new_token(tmp_path: Path) -> None:
    user = plugin_user(tmp_path)  # no expiry: cached until the server refuses it

    async def main() -> None:
        async with peer() as server:
            server.rejected = {"Bearer tok-1"}
            async with await KubeApi.connect(
                kubeconfig(tmp_path / "kubeconfig", {"server": server.url}, user)
            ) as api:
                assert (await api.get("/a"))["authorization"] == "Bearer tok-2"
                await api.get("/b")
                async with api.watch("/w", "1", 5) as _events:
                    pass
                server.rejected = {"Bearer tok-2", "Bearer tok-3"}
                with pytest.raises(KubeApiError) as info:  # retried once, then the 401 is the answer
                    await api.get("/c")
                assert (info.value.status, info.value.reason) == (401, "Unauthorized")
            assert server.seen == [
                "Bearer tok-1",
                "Bearer tok-2",
                "Bearer tok-2",
                "Bearer tok-2",
                "Bearer tok-2",
                "Bearer tok-3",
            ]
            assert len(plugin_runs(tmp_path)) == 3

    run(main)


def test_exec_plugin_client_certificate_is_presented_over_tls(tmp_path: Path) -> None:
    pki = Pki.new()
    pki.write(tmp_path / "pki")
    user = plugin_user(
        tmp_path,
        V1BETA1,
        PLUGIN_CERT=str(tmp_path / "pki/client.crt"),
        PLUGIN_KEY=str(tmp_path / "pki/client.key"),
    )

    async def main() -> None:
        async with peer(pki.mtls()) as server:
            cluster = {"server": server.url, "certificate-authority": "pki/ca.crt"}
            async with await KubeApi.connect(kubeconfig(tmp_path / "kubeconfig", cluster, user)) as api:
                assert await api.get("/") == {"authorization": "", "cn": "admin"}
            info = plugin_runs(tmp_path)[0]["info"]["spec"]["cluster"]
            assert info["certificate-authority-data"] == b64(pki.ca)

    run(main)


def test_a_failing_exec_plugin_is_a_config_error_naming_the_user_and_its_stderr(tmp_path: Path) -> None:
    user = plugin_user(tmp_path, PLUGIN_FAIL="1")
    path = kubeconfig(tmp_path / "kubeconfig", {"server": "http://127.0.0.1:1"}, user)

    async def main() -> None:
        with pytest.raises(KubeConfigError) as info:
            await KubeApi.connect(path)
        assert str(info.value) == (
            f"kubeconfig {path}: user 'u': exec: '{tmp_path}/bin/plugin' exited with 3: "
            "cannot reach the identity provider"
        )

    run(main)


def test_a_missing_exec_command_names_the_user_and_the_install_hint(tmp_path: Path) -> None:
    user = {"exec": {"apiVersion": V1, "command": "no-such-plugin-xyz", "installHint": "brew install xyz"}}
    path = kubeconfig(tmp_path / "kubeconfig", {"server": "http://127.0.0.1:1"}, user)

    async def main() -> None:
        with pytest.raises(
            KubeConfigError,
            match=r"user 'u': exec.command: cannot run 'no-such-plugin-xyz': .*\(brew install xyz\)$",
        ):
            await KubeApi.connect(path)

    run(main)


# --- token files and in-cluster -----------------------------------------------------------------------------


def test_token_file_is_reread_after_the_period_and_after_a_401(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("one\n")

    async def main() -> None:
        async with peer() as server:
            path = kubeconfig(
                tmp_path / "kubeconfig", {"server": server.url}, {"tokenFile": "token", "token": "ignored"}
            )
            every_time = await load_credentials(path, token_reread_s=0.0)
            assert await every_time.headers() == {"Authorization": "Bearer one"}
            token.write_text("two")
            assert await every_time.headers() == {"Authorization": "Bearer two"}
            credentials = await load_credentials(path)  # the default: once a minute
            async with KubeApi(credentials.server, None, credentials=credentials) as api:
                token.write_text("three")
                assert (await api.get("/"))["authorization"] == "Bearer two"
                server.rejected = {"Bearer two"}
                assert (await api.get("/"))["authorization"] == "Bearer three"
                token.unlink()  # a failed re-read keeps the last token
                assert not await credentials.unauthorized({"Authorization": "Bearer three"})
                assert await credentials.headers() == {"Authorization": "Bearer three"}

    run(main)


def test_in_cluster_uses_the_service_account_token_and_ca_and_rereads_the_token(tmp_path: Path) -> None:
    pki = Pki.new()
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(pki.ca)
    (account / "token").write_text("sa-token-1")

    async def main() -> None:
        async with peer(server_ssl_context(*pki.server)) as server:
            port = server.url.rsplit(":", 1)[1]
            env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
            credentials = await load_credentials(
                None, environ=env, service_account_dir=account, token_reread_s=0.0
            )
            assert credentials.server == server.url
            async with KubeApi(credentials.server, credentials.ssl_context, credentials=credentials) as api:
                assert (await api.get("/"))["authorization"] == "Bearer sa-token-1"
                (account / "token").write_text("sa-token-2")
                assert (await api.get("/"))["authorization"] == "Bearer sa-token-2"

    run(main)


def in_cluster_error(env: dict[str, str], account: Path) -> str:
    async def main() -> str:
        with pytest.raises(KubeConfigError) as info:
            await load_credentials(None, environ=env, service_account_dir=account, flag="--kubeconfig")
        return str(info.value)

    return asyncio.run(main())


def test_in_cluster_brackets_an_ipv6_host_and_names_what_is_missing(tmp_path: Path) -> None:
    account = tmp_path / "sa"
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    where = "in-cluster config (no --kubeconfig)"
    assert in_cluster_error({}, account).startswith(
        f"{where}: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"
    )
    bad_port = {**env, "KUBERNETES_SERVICE_PORT": "https"}
    assert (
        in_cluster_error(bad_port, account)
        == f"{where}: KUBERNETES_SERVICE_PORT: 'https' is not a port number"
    )
    assert in_cluster_error(env, account) == f"{where}: token: {account}/token: no such file"
    account.mkdir()
    (account / "token").write_text("  \n")
    assert in_cluster_error(env, account) == f"{where}: token: {account}/token: empty"
    (account / "token").write_text("t")
    assert in_cluster_error(env, account) == f"{where}: ca.crt: {account}/ca.crt: no such file"
    (account / "ca.crt").write_bytes(Pki.new().ca)
    credentials = asyncio.run(load_credentials(None, environ=env, service_account_dir=account))
    assert credentials.server == "https://[fd00::1]:443"


# --- $KUBECONFIG, the auth-provider fallback, errors reading files ------------------------------------------


def test_kubeconfig_env_merges_two_files_first_wins_and_skips_missing_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = {
        "users": [{"name": "u", "user": {"token": "from-first"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    with ApiServerRunner() as server:
        second = {
            "clusters": [{"name": "c", "cluster": {"server": server.base_url}}],
            "users": [{"name": "u", "user": {"token": "from-second"}}],
            "contexts": [{"name": "other", "context": {"cluster": "c"}}],
            "current-context": "other",
        }
        (tmp_path / "first").write_text(yaml.safe_dump(first))
        (tmp_path / "second").write_text(yaml.safe_dump(second))
        monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/first:{tmp_path}/missing::{tmp_path}/second")

        async def main() -> None:
            async with await KubeApi.connect(None) as api:
                assert api.credentials is not None
                assert await api.credentials.headers() == {"Authorization": "Bearer from-first"}
                assert "items" in await api.get("/api/v1/namespaces")
            async with await KubeApi.connect(None, context="other") as api:
                assert api.credentials is not None and await api.credentials.headers() == {}

        run(main)
        monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/missing")
        with pytest.raises(
            KubeConfigError, match=f"^KUBECONFIG={tmp_path}/missing: none of its files exists$"
        ):
            asyncio.run(KubeApi.connect(None))


def test_auth_provider_falls_back_to_the_official_loader_and_logs_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJtZSJ9.c2ln"  # a JWT without "exp": never expires
    user = {
        "auth-provider": {
            "name": "oidc",
            "config": {"id-token": token, "client-id": "x", "idp-issuer-url": "https://idp"},
        }
    }

    async def main() -> None:
        async with peer() as server:
            path = kubeconfig(tmp_path / "kubeconfig", {"server": server.url}, user)
            with caplog.at_level(logging.INFO, logger="hami_kube.config"):
                async with await KubeApi.connect(path) as api:
                    assert (await api.get("/"))["authorization"] == f"Bearer {token}"
        assert (
            f"kubeconfig {path}: user 'u': auth-provider 'oidc' is not loaded by hami_kube itself"
            in caplog.text
        )

    run(main)


FILE_ERRORS = [
    (
        {"certificate-authority": "missing.crt"},
        None,
        "cluster 'c': certificate-authority: {dir}/missing.crt: no such file",
    ),
    (
        {"certificate-authority-data": b64(b"not a certificate")},
        None,
        "cluster 'c': certificate-authority-data: not a usable PEM certificate",
    ),
    (
        {},
        {"client-certificate": "missing.crt", "client-key": "missing.key"},
        "user 'u': client-certificate: {dir}/missing.crt: no such file",
    ),
    (
        {},
        {"client-certificate-data": b64(b"junk"), "client-key-data": b64(b"junk")},
        "user 'u': client-certificate-data/client-key-data: not a matching PEM certificate and key",
    ),
    ({}, {"tokenFile": "missing-token"}, "user 'u': tokenFile: {dir}/missing-token: no such file"),
]


@pytest.mark.parametrize(("cluster", "user", "message"), FILE_ERRORS)
def test_files_a_kubeconfig_names_are_checked_at_connect_and_named_with_entry_and_key(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any] | None, message: str
) -> None:
    path = kubeconfig(tmp_path / "kubeconfig", {"server": "https://127.0.0.1:1", **cluster}, user)
    with pytest.raises(KubeConfigError) as info:
        asyncio.run(KubeApi.connect(path))
    assert str(info.value).startswith(f"kubeconfig {path}: " + message.format(dir=tmp_path))


def test_a_file_that_is_not_yaml_is_named(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match=f"^kubeconfig {path}: not YAML: "):
        asyncio.run(KubeApi.connect(path))
