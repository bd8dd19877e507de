"""hami_kube.config's pure parts: merging kubeconfig documents (client-go's first-wins rule), choosing
the context, reading a cluster's and a user's keys, an exec plugin's ExecCredential, and every mistake
named by file, entry and key."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from hami_kube.config import (
    Entry,
    context_namespace,
    join_host_port,
    merge_documents,
    parse_cluster,
    parse_exec_credential,
    parse_user,
    select,
)
from hami_kube.errors import KubeConfigError

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"
A, B = Path("/etc/kube/a"), Path("/home/me/b")


def doc(
    *,
    clusters: dict[str, Any] | None = None,
    users: dict[str, Any] | None = None,
    contexts: dict[str, Any] | None = None,
    current: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": "v1", "kind": "Config"}
    for key, kind, items in (
        ("clusters", "cluster", clusters),
        ("users", "user", users),
        ("contexts", "context", contexts),
    ):
        if items is not None:
            out[key] = [{"name": name, kind: body} for name, body in items.items()]
    if current is not None:
        out["current-context"] = current
    return out


def test_merge_takes_each_name_and_the_current_context_from_the_first_file_that_has_it() -> None:
    first = doc(
        users={"u": {"token": "first"}}, contexts={"ctx": {"cluster": "c", "user": "u"}}, current="ctx"
    )
    second = doc(
        clusters={"c": {"server": "https://second"}},
        users={"u": {"token": "second"}, "v": {"token": "only-second"}},
        current="other",
    )
    merged = merge_documents([(A, first), (B, second)])
    assert merged.current_context == "ctx"
    assert merged.users["u"].body == {"token": "first"} and merged.users["u"].source == A
    assert merged.users["v"].source == B and merged.clusters["c"].source == B
    chosen = select(merged)
    assert (chosen.context.name, chosen.cluster.name) == ("ctx", "c")
    assert chosen.user is not None and chosen.user.body == {"token": "first"}


def test_merge_skips_empty_documents_and_a_later_file_sets_current_context_when_the_first_has_none() -> None:
    merged = merge_documents([(A, None), (B, doc(current="x")), (A, doc(current="y"))])
    assert merged.current_context == "x" and merged.files == (A, B, A)


@given(st.lists(st.dictionaries(st.sampled_from("abcd"), st.text(max_size=3), max_size=4), max_size=5))
def test_merged_entries_come_from_the_first_document_naming_them(tokens: list[dict[str, str]]) -> None:
    documents = [
        (Path(f"/f{i}"), doc(users={n: {"token": t} for n, t in d.items()})) for i, d in enumerate(tokens)
    ]
    merged = merge_documents(documents)
    for name, entry in merged.users.items():
        first = next(i for i, d in enumerate(tokens) if name in d)
        assert entry.source == Path(f"/f{first}") and entry.body == {"token": tokens[first][name]}


def test_select_takes_the_given_context_over_the_current_one_and_a_context_without_user() -> None:
    merged = merge_documents(
        [
            (
                A,
                doc(
                    clusters={"c": {"server": "http://x"}},
                    contexts={"one": {"cluster": "c"}, "two": {"cluster": "c", "user": ""}},
                    current="one",
                ),
            )
        ]
    )
    assert select(merged).context.name == "one" and select(merged).user is None
    assert select(merged, "two").context.name == "two"


def test_cluster_keys_are_read_and_relative_paths_resolved_against_the_kubeconfig_directory() -> None:
    cluster = parse_cluster(
        Entry(
            "c",
            {"server": "https://k:6443/", "certificate-authority": "pki/ca.crt", "tls-server-name": "kube"},
            A,
        )
    )
    assert cluster.server == "https://k:6443"
    assert cluster.ca_file == Path("/etc/kube/pki/ca.crt") and cluster.ca_data is None
    assert cluster.tls_server_name == "kube" and not cluster.insecure
    absolute = parse_cluster(Entry("c", {"server": "https://k", "certificate-authority": "/ca.crt"}, A))
    assert absolute.ca_file == Path("/ca.crt")
    data = parse_cluster(
        Entry(
            "c",
            {"server": "https://k", "certificate-authority-data": base64.b64encode(b"PEM\n" * 30).decode()},
            A,
        )
    )
    assert data.ca_data == b"PEM\n" * 30


def test_user_keys_are_read_with_relative_paths_and_the_exec_command_resolved() -> None:
    user = parse_user(
        Entry(
            "u",
            {
                "tokenFile": "token",
                "client-certificate": "u.crt",
                "client-key-data": base64.b64encode(b"KEY").decode(),
                "exec": {
                    "apiVersion": V1BETA1,
                    "command": "./bin/plugin",
                    "args": ["--a"],
                    "env": [{"name": "X", "value": "1"}],
                    "provideClusterInfo": True,
                },
            },
            B,
        )
    )
    assert user.token_file == Path("/home/me/token") and user.cert_file == Path("/home/me/u.crt")
    assert user.key_data == b"KEY" and user.key_file is None
    assert user.exec is not None and user.exec.command == "/home/me/bin/plugin"
    assert user.exec.args == ("--a",) and user.exec.env == (("X", "1"),) and user.exec.provide_cluster_info
    on_path = parse_user(
        Entry("u", {"exec": {"apiVersion": V1, "command": "aws", "interactiveMode": "Never"}}, B)
    )
    assert on_path.exec is not None and on_path.exec.command == "aws"
    provider = parse_user(Entry("u", {"auth-provider": {"name": "oidc", "config": {}}}, B))
    assert provider.auth_provider == "oidc"


def test_join_host_port_brackets_ipv6_hosts() -> None:
    assert join_host_port("10.0.0.1", "443") == "10.0.0.1:443"
    assert join_host_port("fd00::1", "443") == "[fd00::1]:443"
    assert join_host_port("fe80::1%eth0", "6443") == "[fe80::1%eth0]:6443"


# --- every mistake names the file, the entry and the key ----------------------------------------------------

NOT_B64 = "not base64!"

CLUSTER_ERRORS = [
    ({}, "server: missing"),
    ({"server": "k:6443"}, "server: 'k:6443' is not an http(s) URL"),
    ({"server": "https://"}, "server: 'https://' is not an http(s) URL"),
    ({"server": 7}, "server: not a string, got int 7"),
    (
        {"server": "https://k", "certificate-authority-data": NOT_B64},
        "certificate-authority-data: not base64",
    ),
    (
        {"server": "https://k", "certificate-authority": "ca", "certificate-authority-data": "QQ=="},
        "certificate-authority-data: given together with certificate-authority",
    ),
    (
        {"server": "https://k", "certificate-authority": "ca", "insecure-skip-tls-verify": True},
        "insecure-skip-tls-verify: true together with a certificate authority",
    ),
    (
        {"server": "https://k", "insecure-skip-tls-verify": "yes"},
        "insecure-skip-tls-verify: not true or false",
    ),
]


@pytest.mark.parametrize(("body", "message"), CLUSTER_ERRORS)
def test_cluster_mistakes_name_the_file_cluster_and_key(body: dict[str, Any], message: str) -> None:
    with pytest.raises(KubeConfigError) as info:
        parse_cluster(Entry("c", body, A))
    assert str(info.value).startswith(f"kubeconfig /etc/kube/a: cluster 'c': {message}")


USER_ERRORS = [
    ({"client-key-data": NOT_B64, "client-certificate-data": "QQ=="}, "client-key-data: not base64"),
    ({"client-certificate-data": NOT_B64, "client-key-data": "QQ=="}, "client-certificate-data: not base64"),
    ({"client-certificate": "a.crt"}, r"client-key\(-data\): missing: a client certificate needs both"),
    ({"client-key": "a.key"}, r"client-certificate\(-data\): missing"),
    (
        {"client-certificate": "a", "client-certificate-data": "QQ==", "client-key": "k"},
        "client-certificate-data: given together with client-certificate",
    ),
    (
        {"client-certificate": "a", "client-key": "k", "client-key-data": "QQ=="},
        "client-key-data: given together with client-key",
    ),
    (
        {"token": "t", "username": "me", "password": "pw"},
        "username: given together with a token: only one authentication method",
    ),
    ({"tokenFile": 3}, "tokenFile: not a string, got int 3"),
    ({"as": "someone-else"}, "as: impersonation is not supported"),
    ({"auth-provider": "gcp"}, "auth-provider: not a mapping with a name"),
    (
        {"auth-provider": {"name": "oidc"}, "exec": {"command": "x", "apiVersion": V1}},
        "exec: given together with auth-provider",
    ),
    ({"exec": "plugin"}, "exec: not a mapping, got str 'plugin'"),
    ({"exec": {"apiVersion": V1}}, "exec.command: missing or not a string"),
    ({"exec": {"command": "x"}}, "exec.apiVersion: None is not one of client.authentication.k8s.io/v1, "),
    (
        {"exec": {"command": "x", "apiVersion": "client.authentication.k8s.io/v1alpha1"}},
        "exec.apiVersion: 'client.authentication.k8s.io/v1alpha1' is not one of",
    ),
    (
        {"exec": {"command": "x", "apiVersion": V1, "args": "-v"}},
        "exec.args: not a list of strings, got str '-v'",
    ),
    (
        {"exec": {"command": "x", "apiVersion": V1, "env": [{"value": "1"}]}},
        r"exec.env\[0\]: not a mapping with a name",
    ),
    (
        {"exec": {"command": "x", "apiVersion": V1, "env": [{"name": "A", "value": 1}]}},
        r"exec.env\[0\].value: not a string",
    ),
    (
        {"exec": {"command": "x", "apiVersion": V1, "interactiveMode": "Always"}},
        "exec.interactiveMode: 'Always' needs a terminal",
    ),
    (
        {"exec": {"command": "x", "apiVersion": V1, "interactiveMode": "Sometimes"}},
        "exec.interactiveMode: 'Sometimes' is not Never",
    ),
    (
        {"exec": {"command": "x", "apiVersion": V1, "provideClusterInfo": "yes"}},
        "exec.provideClusterInfo: not true or false",
    ),
]


@pytest.mark.parametrize(("body", "message"), USER_ERRORS)
def test_user_mistakes_name_the_file_user_and_key(body: dict[str, Any], message: str) -> None:
    with pytest.raises(KubeConfigError, match=rf"^kubeconfig /home/me/b: user 'admin': {message}"):
        parse_user(Entry("admin", body, B))


DOCUMENT_ERRORS = [
    ([], "kubeconfig /etc/kube/a: not a kubeconfig (a YAML mapping), got list []"),
    ({"clusters": 7}, "kubeconfig /etc/kube/a: clusters: not a list, got int 7"),
    ({"users": ["u"]}, "kubeconfig /etc/kube/a: users[0]: not a mapping, got str 'u'"),
    ({"contexts": [{"context": {}}]}, "kubeconfig /etc/kube/a: contexts[0]: name: missing or not a string"),
    (
        {"users": [{"name": "u", "user": "token"}]},
        "kubeconfig /etc/kube/a: user 'u': user: not a mapping, got str 'token'",
    ),
    ({"users": [{"name": "u"}, {"name": "u"}]}, "kubeconfig /etc/kube/a: users: user 'u' is listed twice"),
    ({"current-context": ["a"]}, "kubeconfig /etc/kube/a: current-context: not a string, got list ['a']"),
]


@pytest.mark.parametrize(("document", "message"), DOCUMENT_ERRORS)
def test_document_mistakes_name_the_file_and_key(document: object, message: str) -> None:
    with pytest.raises(KubeConfigError) as info:
        merge_documents([(A, document)])
    assert str(info.value) == message


SELECT_ERRORS = [
    (doc(), None, "kubeconfig /etc/kube/a, /home/me/b: current-context: not set, and no context was given"),
    (
        doc(current="gone"),
        None,
        "kubeconfig /etc/kube/a, /home/me/b: current-context: no context named 'gone'",
    ),
    (doc(), "gone", "kubeconfig /etc/kube/a, /home/me/b: context: no context named 'gone'"),
    (
        doc(contexts={"x": {"user": "u"}}, current="x"),
        None,
        "kubeconfig /etc/kube/a: context 'x': cluster: missing or not a string",
    ),
    (
        doc(contexts={"x": {"cluster": "c"}}, current="x"),
        None,
        "kubeconfig /etc/kube/a: context 'x': cluster: no cluster named 'c'",
    ),
    (
        doc(clusters={"c": {}}, contexts={"x": {"cluster": "c", "user": "u"}}, current="x"),
        None,
        "kubeconfig /etc/kube/a: context 'x': user: no user named 'u'",
    ),
]


@pytest.mark.parametrize(("document", "context", "message"), SELECT_ERRORS)
def test_context_mistakes_name_the_files_context_and_key(
    document: dict[str, Any], context: str | None, message: str
) -> None:
    with pytest.raises(KubeConfigError) as info:
        select(merge_documents([(A, document), (B, None)]), context)
    assert str(info.value) == message


# --- ExecCredential -----------------------------------------------------------------------------------------


def credential(api_version: str = V1, **status: Any) -> bytes:
    import json

    return json.dumps({"apiVersion": api_version, "kind": "ExecCredential", "status": status}).encode()


def test_exec_credential_gives_the_token_and_its_expiry_in_unix_time() -> None:
    got = parse_exec_credential(credential(token="t", expirationTimestamp="2030-01-02T03:04:05Z"), V1, "u")
    expected = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC).timestamp()
    assert (got.token, got.expires, got.cert_pem) == ("t", expected, None)
    beta = parse_exec_credential(
        credential(V1BETA1, clientCertificateData="C", clientKeyData="K"), V1BETA1, "u"
    )
    assert (beta.token, beta.cert_pem, beta.key_pem, beta.expires) == (None, b"C", b"K", None)


EXEC_OUTPUT_ERRORS = [
    (b"token: t", "exec: the plugin's output is not JSON"),
    (b"[]", "exec: the plugin's output is not a JSON object"),
    (
        b'{"apiVersion": "client.authentication.k8s.io/v1", "kind": "Pod", "status": {}}',
        "exec: kind: 'Pod', expected 'ExecCredential'",
    ),
    (
        credential(V1BETA1, token="t"),
        f"exec: apiVersion: the plugin answered '{V1BETA1}', the kubeconfig asks for '{V1}'",
    ),
    (
        b'{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential"}',
        "exec: status: missing or not an object",
    ),
    (credential(), "exec: status: neither a token nor clientCertificateData"),
    (
        credential(clientCertificateData="C"),
        "exec: status: clientCertificateData and clientKeyData come together",
    ),
    (credential(token=5), "exec: status.token: not a string"),
    (
        credential(token="t", expirationTimestamp="tomorrow"),
        "exec: status.expirationTimestamp: 'tomorrow' is not an RFC 3339 time",
    ),
]


@pytest.mark.parametrize(("output", "message"), EXEC_OUTPUT_ERRORS)
def test_exec_output_mistakes_name_the_user_and_the_field(output: bytes, message: str) -> None:
    with pytest.raises(KubeConfigError) as info:
        parse_exec_credential(output, V1, "kubeconfig /a: user 'u'")
    assert str(info.value).startswith(f"kubeconfig /a: user 'u': {message}")


def test_context_namespace_is_the_contexts_else_the_service_accounts_else_default(tmp_path: Path) -> None:
    config = doc(
        clusters={"c": {"server": "http://127.0.0.1:1"}},
        contexts={"team": {"cluster": "c", "namespace": "ai-team"}, "plain": {"cluster": "c"}},
        current="team",
    )
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert context_namespace(path) == "ai-team"
    assert context_namespace(path, context="plain") == "default"
    assert context_namespace(None, environ={"KUBECONFIG": str(path)}, context="team") == "ai-team"
    account = tmp_path / "sa"
    account.mkdir()
    assert context_namespace(None, environ={}, service_account_dir=account) == "default"
    (account / "namespace").write_text("hami-system\n")
    assert context_namespace(None, environ={}, service_account_dir=account) == "hami-system"
    with pytest.raises(KubeConfigError, match="no context named 'other'"):
        context_namespace(path, context="other")
