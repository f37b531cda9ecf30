"""The API-server requests of the kubeapi source, sent through the official client's ``ApiClient``.

``ApiClient`` (kubernetes >= 37) does everything that is hard to get right: kubeconfig and
in-cluster configuration, TLS and client certificates, bearer tokens and their refresh, a
pooled urllib3 connection. Its typed API classes only build a path and a query string, and
they are expensive: each is a module of pydantic-annotated methods, and importing
``CoreV1Api`` with the resource.k8s.io classes costs ~29 MB of RSS, more than the rest of the
exporter holds at node scale (``docs/performance.md`` §3). The source needs five requests, so
their paths are written here and the typed classes are never imported.

Every function returns the raw urllib3 response of a 2xx answer with its body unread (the
caller reads it with a bound), and raises the client's ``ApiException`` for any other status
without reading the body, so a hostile error answer costs no memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import urllib3
from kubernetes import config as k8s_config
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from .. import outbound

GROUP_PATH: Final = "/apis/resource.k8s.io"
PODS_PATH: Final = "/api/v1/pods"
NODES_PATH: Final = "/api/v1/nodes"
ACCESS_REVIEW_PATH: Final = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
_AUTH: Final = ["BearerToken"]

Query = Sequence[tuple[str, str | int | bool]]


def slices_path(version: str) -> str:
    return f"{GROUP_PATH}/{version}/resourceslices"


def taint_rules_path(version: str) -> str:
    return f"{GROUP_PATH}/{version}/devicetaintrules"


def get(api_client: ApiClient, path: str, query: Query = (), *, timeout: Any,
        path_params: Mapping[str, str] | None = None) -> Any:
    """``GET path?query``. ``path_params`` fill ``{name}`` placeholders, URL-quoted by the client
    (names come from pod specs and the kubelet: quoting keeps a stray ``/`` inside one segment)."""
    return _send(api_client, "GET", path, query, None, timeout, path_params)


def get_claim(api_client: ApiClient, version: str, namespace: str, name: str, *, timeout: Any) -> Any:
    return get(api_client, f"{GROUP_PATH}/{version}/namespaces/{{namespace}}/resourceclaims/{{name}}",
               timeout=timeout, path_params={"namespace": namespace, "name": name})


def post(api_client: ApiClient, path: str, body: Mapping[str, Any], *, timeout: Any) -> Any:
    return _send(api_client, "POST", path, (), body, timeout, None)


def _send(api_client: ApiClient, method: str, path: str, query: Query, body: Mapping[str, Any] | None,
          timeout: Any, path_params: Mapping[str, str] | None) -> Any:
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    request = api_client.param_serialize(method=method, resource_path=path, path_params=dict(path_params or {}),
                                         query_params=list(query), header_params=headers, body=body,
                                         auth_settings=_AUTH)
    outbound.bound_heads(api_client.rest_client.pool_manager)
    # The status line and headers within the request timeout (a watch: its connect-and-head part),
    # however the server trickles them; the body is read with its own bound (``outbound.read_body``).
    head_s = float(timeout if isinstance(timeout, (int, float)) else timeout[0])
    try:
        with outbound.answer_within(head_s):
            answer = api_client.call_api(*request, _request_timeout=timeout)
    except outbound.AnswerTooSlow:
        # As the client's own timeout is reported: every caller already words that one.
        why = f"no status line and headers within {head_s:g} s"
        raise urllib3.exceptions.ReadTimeoutError(None, path, why) from None  # type: ignore[arg-type]  # no pool to name
    if not 200 <= answer.status <= 299:
        answer.response.close()  # the body is not needed, and may be anything: never read it
        raise ApiException(status=answer.status, reason=answer.reason)
    return answer.response


# The client's configuration loaders and ``ApiClient.close`` carry no annotations (its generated
# request methods do); these are the signatures this project calls them with, so mypy --strict
# checks the calls instead of waving untyped ones through.
class _LoadKubeConfig(Protocol):
    def __call__(self, *, client_configuration: Configuration, persist_config: bool,
                 config_file: str | None = None, context: str | None = None) -> None: ...


class _LoadInClusterConfig(Protocol):
    def __call__(self, *, client_configuration: Configuration) -> None: ...


class _ListKubeConfigContexts(Protocol):
    """(every context, the current one), each ``{"name": …, "context": {"namespace": …, …}}``."""

    def __call__(self, *, config_file: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]: ...


load_kube_config: Final[_LoadKubeConfig] = k8s_config.load_kube_config
load_incluster_config: Final[_LoadInClusterConfig] = k8s_config.load_incluster_config
list_kube_config_contexts: Final[_ListKubeConfigContexts] = k8s_config.list_kube_config_contexts
close_client: Final[Callable[[ApiClient], None]] = ApiClient.close
