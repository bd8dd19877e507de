"""Discovery documents: /version, /api, /api/v1, /apis, /apis/<group>[/<version>], and minimal OpenAPI.

kubectl reads these to map kinds to resources (legacy discovery; the aggregated form is declined by
answering plain `application/json`). The OpenAPI v3 documents only say which operations exist and that
they accept `fieldValidation`, so `kubectl create -f` uses server-side validation instead of needing
full schemas.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from hami_sim.apiserver.strategy import BY_PATH, GROUP_VERSIONS, RESOURCES, ResourceInfo

JSON = dict[str, Any]

KUBE_VERSION = {
    "major": "1",
    "minor": "36",
    "gitVersion": "v1.36.0-hami-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

# Subresources served, with their kind and verbs, beyond `status` (which mirrors its parent).
_SUBRESOURCE_KINDS = {"binding": ("Binding", ("create",))}


def version() -> JSON:
    return dict(KUBE_VERSION)


def api_versions(server_address: str) -> JSON:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _storage_hash(info: ResourceInfo) -> str:
    import base64

    digest = hashlib.sha256(f"{info.group}/{info.version}/{info.kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


def _resource_entry(info: ResourceInfo) -> JSON:
    entry: JSON = {
        "name": info.plural,
        "singularName": info.singular,
        "namespaced": info.namespaced,
        "kind": info.kind,
        "verbs": list(info.verbs),
        "storageVersionHash": _storage_hash(info),
    }
    if info.short_names:
        entry["shortNames"] = list(info.short_names)
    if info.categories:
        entry["categories"] = list(info.categories)
    return entry


def _subresource_entries(info: ResourceInfo) -> list[JSON]:
    out: list[JSON] = []
    for sub in info.subresources:
        verbs: tuple[str, ...]
        if sub == "status":
            kind, verbs = info.kind, ("get", "patch", "update")
        else:
            kind, verbs = _SUBRESOURCE_KINDS[sub]
        out.append(
            {
                "name": f"{info.plural}/{sub}",
                "singularName": "",
                "namespaced": info.namespaced,
                "kind": kind,
                "verbs": list(verbs),
            }
        )
    return out


def resource_list(group: str, version: str) -> JSON | None:
    """The APIResourceList of one group version, or None when it is not served."""
    if version not in GROUP_VERSIONS.get(group, ()):
        return None
    resources: list[JSON] = []
    for info in RESOURCES:
        if info.group == group and info.version == version:
            resources.append(_resource_entry(info))
            resources.extend(_subresource_entries(info))
    if group == "" and version == "v1":
        resources.append(
            {
                "name": "bindings",
                "singularName": "binding",
                "namespaced": True,
                "kind": "Binding",
                "verbs": ["create"],
            }
        )
    resources.sort(key=lambda r: r["name"])
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def _group(name: str) -> JSON:
    versions = [{"groupVersion": f"{name}/{v}", "version": v} for v in GROUP_VERSIONS[name]]
    return {"name": name, "versions": versions, "preferredVersion": versions[0]}


def api_group_list() -> JSON:
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(name) for name in GROUP_VERSIONS if name],
    }


def api_group(name: str) -> JSON | None:
    if not name or name not in GROUP_VERSIONS:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)}


# ---------------------------------------------------------------------------------------------
# OpenAPI v3: one document per group version, listing the paths and their operations.


def _gvk(info: ResourceInfo) -> list[JSON]:
    return [{"group": info.group, "version": info.version, "kind": info.kind}]


def _params(*names: str) -> list[JSON]:
    return [{"name": n, "in": "query", "schema": {"type": "string"}, "uniqueItems": True} for n in names]


def _ref(info: ResourceInfo) -> str:
    return f"#/components/schemas/{_schema_name(info)}"


def _schema_name(info: ResourceInfo) -> str:
    group = info.group or "core"
    return f"io.k8s.api.{group.split('.')[0]}.{info.version}.{info.kind}"


def _op(info: ResourceInfo, action: str, *, body: bool = False, params: tuple[str, ...] = ()) -> JSON:
    op: JSON = {
        "operationId": f"{action}{info.kind}",
        "parameters": _params(*params),
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": _ref(info)}}}}
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(info)[0],
    }
    if body:
        op["requestBody"] = {"content": {"*/*": {"schema": {"$ref": _ref(info)}}}, "required": True}
    return op


def _paths_for(info: ResourceInfo) -> dict[str, JSON]:
    prefix = f"/apis/{info.group}/{info.version}" if info.group else f"/api/{info.version}"
    collection = (
        f"{prefix}/namespaces/{{namespace}}/{info.plural}" if info.namespaced else f"{prefix}/{info.plural}"
    )
    write = ("dryRun", "fieldManager", "fieldValidation")
    paths: dict[str, JSON] = {
        collection: {
            "get": _op(info, "list", params=("labelSelector", "fieldSelector", "watch", "resourceVersion")),
            "post": _op(info, "post", body=True, params=write),
            "delete": _op(info, "deletecollection"),
        },
        f"{collection}/{{name}}": {
            "get": _op(info, "get"),
            "put": _op(info, "put", body=True, params=write),
            "patch": _op(info, "patch", body=True, params=(*write, "force")),
            "delete": _op(info, "delete"),
        },
    }
    if info.has_status:
        paths[f"{collection}/{{name}}/status"] = {
            "get": _op(info, "get"),
            "put": _op(info, "put", body=True, params=write),
            "patch": _op(info, "patch", body=True, params=(*write, "force")),
        }
    return paths


def _openapi_key(info: ResourceInfo) -> str:
    return f"apis/{info.group}/{info.version}" if info.group else f"api/{info.version}"


def openapi_v3_document(key: str) -> JSON | None:
    """The OpenAPI v3 document for `api/v1` or `apis/<group>/<version>`, or None."""
    infos = [info for info in RESOURCES if _openapi_key(info) == key]
    if not infos:
        return None
    paths: dict[str, JSON] = {}
    schemas: dict[str, JSON] = {}
    for info in infos:
        paths.update(_paths_for(info))
        schemas[_schema_name(info)] = {
            "type": "object",
            "description": f"{info.kind} (schema not published by the hami-sim API server)",
            "x-kubernetes-group-version-kind": _gvk(info),
            "x-kubernetes-preserve-unknown-fields": True,
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": KUBE_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _doc_hash(key: str) -> str:
    return hashlib.sha512(orjson.dumps(openapi_v3_document(key))).hexdigest()[:64].upper()


def openapi_v3_index() -> JSON:
    keys = sorted({_openapi_key(info) for info in RESOURCES})
    return {"paths": {key: {"serverRelativeURL": f"/openapi/v3/{key}?hash={_doc_hash(key)}"} for key in keys}}


def resource_for(group: str, version: str, plural: str) -> ResourceInfo | None:
    return BY_PATH.get((group, version, plural))
