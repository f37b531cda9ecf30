"""Source: the API server's view of this node — ResourceSlices, the claims local pods use, pods.

Contract: ``KubeApiSource.collect()`` returns a ``model.ClusterSnapshot`` (slices of the highest
pool generation only, claims, pods) and raises ``SourceError`` with an operator's message when
there is no API access (no in-cluster service account and no kubeconfig, RBAC, API server down).
The agent runs it with ``keep_last_good``: during an outage the last good view stays in use and
``dra_exporter_source_up{source="kubeapi"}`` says 0.

What it asks the API server, and why the load per node does not grow with the cluster:

* discovery: one ``GET /apis/resource.k8s.io``; the first of v1, v1beta2, v1beta1 that the
  server serves and the installed client knows is used;
* ResourceSlices and Pods: one list, then one watch each, filtered by ``spec.nodeName=<node>``
  (the kubelet's own pattern). A watch resumes from the last ``resourceVersion`` it saw (bookmarks
  keep it fresh); when the server answers 410 Gone the source lists again. Watches end after a
  random 5-10 minutes (as client-go's reflectors do), so: ~2 lists at start and ~16 watch
  requests per hour;
* ResourceClaims: never a cluster-wide list or watch. Each claim a local pod references (from the
  pod watch, plus names the kubelet reports, ``claim_hints``) is fetched with one GET when first
  seen or when a pod that uses it appears or changes its claims, and again ``claim_refresh`` to
  ``(1 + REFRESH_SPREAD) * claim_refresh`` seconds later (``--claim-refresh``, default 300) for
  the status the driver updates (device conditions); the spread keeps claims fetched together
  (a node's start-up, a job's pods) from falling due together, every period, for ever.
  Claims no local pod uses any more are forgotten without a request. Cost: at most 12 GETs per
  claim in use per hour, plus one per claim per pod start.
* the claim census, only while a driver holds a claim on this node (its CDI spec,
  ``prepared_claims``) that no local pod's claim explains: one paged list of the cluster's
  ResourceClaims (``CENSUS_PAGE`` a page), keeping only the claims asked about, when such a UID
  first appears (at most every ``CENSUS_MIN_S``) and again every ``claim_refresh``. A node with
  no such spec sends none; the answer says which of those claims are gone or deallocated
  (``orphans``): a claim UID is never reused, so one the list lacks is known absent. A claim the
  list still finds (its pod just went, the claim is being deleted) is asked about once more
  ``CENSUS_MIN_S`` later.

What it does when the API server misbehaves (``docs/reliability.md`` names the tests; the lists and
watches are ``reflector.Reflector``'s):

* errors, timeouts, connection refused: ``SourceError`` (the last good view stays in use) and
  retries with exponential backoff (``Timeouts.backoff``), for ``collect`` and each watch alike;
  a watch resumes from its resourceVersion afterwards, so an outage costs no re-list;
* a watch that ends within ``HEALTHY_WATCH_S`` of its start (cut at once, or expired with 410
  right after a fresh list) waits with the same backoff before the next request, as client-go's
  reflector does: a load balancer that cuts every stream, or a server that expires every
  resourceVersion, costs a request per backoff period, never a request storm. After
  ``SHORT_WATCHES_ARE_AN_ERROR`` such watches in a row the source reports itself down;
* answers are read with a bound: a list over ``MAX_LIST_BYTES`` and a claim or watch event over
  ``MAX_OBJECT_BYTES`` are refused (``SourceError`` naming the limit) without reading further, an
  answer has the request timeout in all (not per read), and each kind holds at most
  ``max_objects`` objects, so a broken or hostile API server costs at most that much memory and
  time; an object that cannot be read costs that object (one log line), never the watch.

Requests go through the official client's ``ApiClient`` (configuration, auth, TLS, in-cluster
token refresh) with paths of our own (``kubeapi_http``: the typed API classes cost ~29 MB of RSS
to import). Answers are read as raw JSON and normalised by ``kubeapi_normalize``: the typed
models differ per version and client release (``V1ResourceClaim`` changed meaning in 34.x), drop
fields newer than the client, and cost a deserialisation per watch event. The dynamic client was
not used because it discovers every group of the cluster and caches discovery in a temporary file.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .. import model
from ..backoff import Backoff
from ..dra_versions import GROUP
from ..join_domains import DOMAIN_UID_LABEL, referenced_domains
from . import Source, SourceError
from . import computedomain as cd
from . import kubeapi_http as http
from .kubeapi_normalize import (
    SUPPORTED_VERSIONS,
    TAINT_RULE_VERSIONS,
    choose_version,
    claim_from_dict,
    current_slices,
    node_labels,
    pod_from_dict,
    resource_names,
    served_versions,
    slice_from_dict,
    slices_for_node,
    taint_rule_from_dict,
)
from .reflector import MAX_LIST_BYTES as MAX_LIST_BYTES
from .reflector import MAX_OBJECT_BYTES as MAX_OBJECT_BYTES
from .reflector import (
    MAX_OBJECTS,
    RBAC_HINT,
    Reflector,
    api_error,
    close_watches,
    read_json,
    readable,
    request,
    unreachable,
)
from .reflector import Timeouts as Timeouts

SOURCE: Final = "kubeapi"
NO_ACCESS: Final = ("kubeapi: no API server access (no in-cluster service account, no kubeconfig): "
                    "node-local attribution only")
#: Claims a page of the census list holds (client-go's pager's default).
CENSUS_PAGE: Final = 500
#: The census runs at most this often when new unexplained claim UIDs appear.
CENSUS_MIN_S: Final = 30.0
#: A claim's next refresh falls due at a random point of [1, 1 + REFRESH_SPREAD] x claim_refresh.
REFRESH_SPREAD: Final = 0.2
#: While NVIDIA's ComputeDomain CRDs are not both served, ``resource.nvidia.com`` is discovered
#: again this often: a driver installed after the exporter is found within it, for one GET per
#: node per period (kubectl's discovery cache lives as long).
REDISCOVER_S: Final = 600.0

T = TypeVar("T")


def load_client(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
    """An API client from ``kubeconfig``, else the in-cluster service account, else ``$KUBECONFIG``
    or ``~/.kube/config``; ``context`` names a kubeconfig context (a kubeconfig then, never the
    service account), None its current one. Raises ``SourceError`` when there is none or it cannot be read."""
    cfg = k8s.Configuration()
    try:
        if kubeconfig or context:
            http.load_kube_config(config_file=kubeconfig or _default_kubeconfig(), context=context,
                                  client_configuration=cfg, persist_config=False)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            http.load_incluster_config(client_configuration=cfg)
        elif os.path.exists(_default_kubeconfig()):
            http.load_kube_config(client_configuration=cfg, persist_config=False)
        else:
            raise SourceError(NO_ACCESS)
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - YAML, base64, missing keys, exec plugins: all "cannot use"
        where = kubeconfig or ("the in-cluster service account" if os.environ.get("KUBERNETES_SERVICE_HOST")
                               else _default_kubeconfig())
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SourceError(f"kubeapi: cannot use {where}: {detail}") from None
    # The source retries on its own schedule; urllib3's silent retries would hide (and multiply) requests.
    cfg.retries = 0
    return k8s.ApiClient(cfg)


def _default_kubeconfig() -> str:
    return os.path.expanduser(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0])


def server_version(api_client: k8s.ApiClient, timeout: float = 10.0) -> str:
    """The API server's ``gitVersion`` (``v1.36.2``) from ``GET /version``; ``""`` when it cannot be
    read (the allocator then models the newest scheduler: ``cluster.scheduler_versions``)."""
    try:
        response = http.get(api_client, "/version", timeout=timeout)
        body = read_json(response, "GET /version", seconds=timeout)
    except (ApiException, SourceError, urllib3.exceptions.HTTPError, OSError):
        return ""
    version = body.get("gitVersion")
    return version[:64] if isinstance(version, str) else ""


def discover(api_client: k8s.ApiClient, timeout: float = 10.0) -> tuple[tuple[str, ...], str]:
    """(versions the server serves, the one to read): one ``GET /apis/resource.k8s.io``.
    Raises ``SourceError`` when the group is not served or serves no version dra-exporter reads."""
    try:
        response = http.get(api_client, http.GROUP_PATH, timeout=timeout)
    except ApiException as exc:
        if exc.status == 404:
            raise SourceError(f"kubeapi: the API server does not serve {GROUP} "
                              "(Kubernetes before 1.32, or DRA turned off)") from None
        raise api_error(exc, f"discover {GROUP}") from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise unreachable(exc) from None
    served = served_versions(read_json(response, f"discover {GROUP}", seconds=timeout))
    version = choose_version(served, SUPPORTED_VERSIONS)
    if version is None:
        raise SourceError(f"kubeapi: no {GROUP} version both served ({', '.join(served) or 'none'}) and "
                          f"read by dra-exporter ({', '.join(SUPPORTED_VERSIONS)})")
    return served, version


@dataclass(frozen=True, slots=True)
class Probe:
    """One access check for ``dra-exporter doctor``."""

    ok: bool
    message: str


#: (verb, group, resource) the source needs; lists are tried for real, the rest asked of the
#: authoriser with a SelfSubjectAccessReview.
NEEDED_ACCESS: Final = (("watch", GROUP, "resourceslices"), ("get", GROUP, "resourceclaims"),
                         ("list", GROUP, "resourceclaims"), ("watch", "", "pods"))


def probe(api_client: k8s.ApiClient, node_name: str, version: str, *, timeout: float = 10.0,
          access_review: bool = True) -> list[Probe]:
    """List this node's slices and pods once, and ask whether the watches and claim GETs are allowed."""
    selector = f"spec.nodeName={node_name}"
    results = []
    for kind, path in (("resourceslices", http.slices_path(version)), ("pods", http.PODS_PATH)):
        try:
            body = read_json(request(f"list {kind}", lambda path=path: http.get(  # type: ignore[misc]
                api_client, path, [("fieldSelector", selector)], timeout=timeout)), f"list {kind}", MAX_LIST_BYTES,
                timeout)
        except SourceError as exc:
            results.append(Probe(False, str(exc).removeprefix("kubeapi: ")))
            continue
        results.append(Probe(True, f"{kind} with {selector}: {len(body.get('items') or ())}"))
    if access_review:
        results.extend(_review(api_client, verb, group, resource, timeout) for verb, group, resource in NEEDED_ACCESS)
    return results


def _review(api_client: k8s.ApiClient, verb: str, group: str, resource: str, timeout: float) -> Probe:
    what = f"{verb} {resource}" + (f".{group}" if group else "")
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource}}}
    try:
        answer = read_json(http.post(api_client, http.ACCESS_REVIEW_PATH, review, timeout=timeout),
                           f"check whether it may {what}", seconds=timeout)
    except ApiException as exc:
        return Probe(False, f"could not check whether it may {what}: HTTP {exc.status}")
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return Probe(False, str(unreachable(exc)).removeprefix("kubeapi: "))
    except SourceError as exc:
        return Probe(False, str(exc).removeprefix("kubeapi: "))
    status = answer.get("status")
    allowed = isinstance(status, Mapping) and status.get("allowed") is True
    return Probe(allowed, f"may {what}" if allowed else f"may not {what} ({RBAC_HINT})")




@dataclass(slots=True)
class _CachedClaim:
    info: model.ClaimInfo | None
    """None: the claim does not exist (yet)."""
    due_at: float
    """When it is fetched again (``monotonic`` time)."""




def taint_rule_version(client: k8s.ApiClient, served: Iterable[str], timeouts: Timeouts,
                       requests: Counter[str]) -> str | None:
    """The first of ``TAINT_RULE_VERSIONS`` whose resource list has ``devicetaintrules``
    (one ``GET /apis/resource.k8s.io/<v>`` per served candidate, at start only)."""
    for version in (v for v in TAINT_RULE_VERSIONS if v in served):
        requests["discover"] += 1
        what = f"discover {GROUP}/{version}"
        get = functools.partial(http.get, client, f"{http.GROUP_PATH}/{version}", timeout=timeouts.request)
        body = read_json(request(what, get), what, seconds=timeouts.request)
        if "devicetaintrules" in resource_names(body):
            return version
    return None


class ApiServerSource:
    """What both API-server sources (the node's ``KubeApiSource``, the cluster mode's
    ``ClusterSource``) hold: a client made on first use, the resource.k8s.io version discovered
    once, the requests they sent, and the stop event of their watches."""

    def __init__(self, *, client_factory: Callable[[], k8s.ApiClient] | None, kubeconfig: str | None,
                 timeouts: Timeouts, max_objects: int, logger: logging.Logger | None) -> None:
        self._client_factory = client_factory or (lambda: load_client(kubeconfig))
        self._timeouts = timeouts
        self._max_objects = max_objects
        """Objects one watch (and one list) may hold: past it the kind fails, with one line."""
        self._log = logger or logging.getLogger(type(self).__module__)
        self.requests: Counter[str] = Counter()
        """Requests sent, by ``"<verb> <kind>"``: what this source costs the API server."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client: k8s.ApiClient | None = None
        self.api_version: str | None = None
        """The resource.k8s.io version read (the newest served of those known); None before discovery."""
        self.served: tuple[str, ...] = ()
        self.taint_rule_version: str | None = None
        """The resource.k8s.io version DeviceTaintRules are read in; None: not asked yet (or not served)."""

    def _connect(self) -> tuple[k8s.ApiClient, bool]:
        """The client (made on first use) and whether discovery just ran (``api_version`` is set after)."""
        if self._client is None:
            self._client = self._client_factory()
        if self.api_version is not None:
            return self._client, False
        self.requests["discover"] += 1
        self.served, self.api_version = discover(self._client, self._timeouts.request)
        return self._client, True

    def _taint_rule_version(self) -> str | None:
        assert self._client is not None
        return taint_rule_version(self._client, self.served, self._timeouts, self.requests)

    def _reflector(self, *args: Any, **kw: Any) -> Reflector[Any]:
        kw["max_objects"] = self._max_objects
        return Reflector(*args, **kw)


class KubeApiSource(ApiServerSource, Source[model.ClusterSnapshot]):
    """The cluster view of one node: see the module docstring for what it asks and how often."""

    name = SOURCE

    def __init__(self, node_name: str, *, client_factory: Callable[[], k8s.ApiClient] | None = None,
                 kubeconfig: str | None = None,
                 claim_hints: Callable[[], Iterable[tuple[str, str]]] = tuple,
                 prepared_claims: Callable[[], Iterable[str]] = tuple,
                 claim_refresh: float = 300.0, timeouts: Timeouts = Timeouts(), max_objects: int | None = None,
                 monotonic: Callable[[], float] = time.monotonic, logger: logging.Logger | None = None,
                 simulated: bool = False, pod_labels: tuple[str, ...] = (),
                 wall_clock: Callable[[], float] = time.time) -> None:
        if not node_name:
            raise ValueError("kubeapi: a node name is needed for the spec.nodeName field selectors")
        super().__init__(client_factory=client_factory, kubeconfig=kubeconfig, timeouts=timeouts,
                         max_objects=MAX_OBJECTS if max_objects is None else max_objects, logger=logger)
        self.node_name = node_name
        self._claim_hints = claim_hints
        self._prepared_claims = prepared_claims
        """Claim UIDs drivers prepared devices for on this node (the CDI specs): what the census asks about."""
        self._census: model.ClaimCensus | None = None
        self._census_at = -math.inf
        self._census_said = ""
        self._rechecked: frozenset[str] = frozenset()
        """Claim UIDs a census found present, unexplained, and asked about once more since."""
        """When the census last listed (``monotonic``)."""
        self._wall_clock = wall_clock
        self._claim_refresh = claim_refresh
        self._monotonic = monotonic
        self._simulated = simulated
        """The API server is ``--simulate``'s: say what the simulated cluster has, not what it lacks."""
        self._pod_labels = pod_labels
        """The pod label keys kept on each pod (``--pod-labels``); its other labels are dropped on arrival."""
        self._slices: Reflector[model.ResourceSliceInfo] | None = None
        self._nodeless_slices: Reflector[model.ResourceSliceInfo] | None = None
        self._pods: Reflector[model.PodInfo] | None = None
        self._taint_rules: Reflector[model.DeviceTaintRule] | None = None
        self._domains: Reflector[model.ComputeDomain] | None = None
        self._cliques: Reflector[model.ComputeDomainClique] | None = None
        self.compute_domain_resources: frozenset[str] = frozenset()
        """Which of computedomains/computedomaincliques are read; empty: the CRDs are not served."""
        self._domains_due: float | None = 0.0
        """When ``resource.nvidia.com`` is discovered next (``monotonic``); None: both are read."""
        self._domains_said = ""
        self._node_labels: dict[str, str] | None = None
        self._node_labels_due = 0.0
        self._node_warned = False
        self._claims: dict[tuple[str, str], _CachedClaim] = {}
        self._unreadable: set[str] = set()
        """Claims logged as unreadable (``reflector.readable``)."""
        self._stale: set[tuple[str, str]] = set()
        self._stale_lock = threading.Lock()
        self._revision = 0
        self._revision_lock = threading.Lock()
        self._snapshot: tuple[int, model.ClusterSnapshot] | None = None
        self._backoff = Backoff(*timeouts.backoff, monotonic=monotonic)
        self._last_error = ""

    # --- public ---------------------------------------------------------------------------------

    def collect(self) -> model.ClusterSnapshot:
        with self._lock:
            if self._backoff.remaining():
                raise SourceError(self._last_error)
            try:
                self._start()
                self._discover_compute_domains()
                self._check_watches()
                self._refresh_claims()
                self._refresh_census()
                self._refresh_node_labels()
            except SourceError as exc:
                self._fail(str(exc))
                raise
            self._backoff.succeeded()
            self._last_error = ""
            return self._build_snapshot()

    def close(self) -> None:
        self._stop.set()
        close_watches((self._slices, self._nodeless_slices, self._pods, self._taint_rules, self._domains,
                       self._cliques), self._client, self._log)

    # --- start: client, discovery, first lists, watches -----------------------------------------------

    def _start(self) -> None:
        client, discovered = self._connect()
        version = self.api_version
        assert version is not None
        if discovered:
            self._log.info("kubeapi: reading %s/%s for node %s", GROUP, version, self.node_name)
        if self._slices is None or self._pods is None:
            selector = f"spec.nodeName={self.node_name}"
            slices = self._reflector("resourceslices", client, http.slices_path(version), selector,
                                lambda obj: slice_from_dict(obj, version), self._timeouts, self.requests,
                                on_update=self._bump)
            # Slices that name no node (allNodes, nodeSelector, perDeviceNodeSelection): the API
            # server's field set has spec.nodeName "" for them, so this selector finds exactly those;
            # which of their devices cover this node is decided here (slices_for_node).
            nodeless = self._reflector("resourceslices-nodeless", client, http.slices_path(version), "spec.nodeName=",
                                  lambda obj: slice_from_dict(obj, version), self._timeouts, self.requests,
                                  on_update=self._bump)
            keep = self._pod_labels
            pods = self._reflector("pods", client, http.PODS_PATH, selector,
                              lambda obj: pod_from_dict(obj, keep), self._timeouts, self.requests,
                              changed=self._pod_changed, on_update=self._bump)
            # The first lists happen here, so the first frame already has the cluster view.
            slices.list_once()
            nodeless.list_once()
            pods.list_once()
            slices.start(self._stop)
            nodeless.start(self._stop)
            pods.start(self._stop)
            self._slices, self._nodeless_slices, self._pods = slices, nodeless, pods
            self._start_taint_rules()

    # --- DeviceTaintRules: optional (alpha/beta gates off by default before 1.37, RBAC of older charts) ---

    def _start_taint_rules(self) -> None:
        """List and watch DeviceTaintRules in the first version that serves them. Not served, or
        not allowed: logged once, and the rest of the view goes on without them."""
        assert self._client is not None
        try:
            version = self._taint_rule_version()
            if version is None:
                if self._simulated:
                    self._log.info("kubeapi: the simulated cluster has the scenario's ResourceSlices, "
                                   "ResourceClaims and pods (`cluster --simulate` simulates DeviceTaintRules)")
                else:
                    self._log.info("kubeapi: %s serves no DeviceTaintRules (gate DRADeviceTaintRules off, or "
                                   "Kubernetes before 1.33): only the slices' own taints are shown", GROUP)
                return
            rules = self._reflector("devicetaintrules", self._client, http.taint_rules_path(version), None,
                               taint_rule_from_dict, self._timeouts, self.requests, on_update=self._bump)
            rules.list_once()
        except SourceError as exc:
            self._log.warning("kubeapi: DeviceTaintRules not read: %s (the rest of the cluster view is)",
                              str(exc).removeprefix("kubeapi: "))
            return
        rules.start(self._stop)
        self.taint_rule_version, self._taint_rules = version, rules

    # --- ComputeDomains: only where NVIDIA's CRDs are served ------------------------------------------

    def _discover_compute_domains(self) -> None:
        """List and watch ComputeDomains (cluster-wide: they are few) and the cliques that carry a
        domain label, once ``resource.nvidia.com/v1beta1`` serves them. One discovery request at
        start and, while either is not served, every ``REDISCOVER_S``: NVIDIA's driver may be
        installed after the exporter. Not served (404) is the feature off; not allowed, or failing,
        leaves the rest of the view going on. Each is logged once, until it changes."""
        now = self._monotonic()
        if self._domains_due is None or now < self._domains_due:
            return
        self._domains_due = now + REDISCOVER_S
        assert self._client is not None
        client, path = self._client, f"/apis/{cd.GROUP}/{cd.VERSION}"
        self.requests["discover"] += 1
        try:
            response = http.get(client, path, timeout=self._timeouts.request)
            found = cd.served(read_json(response, f"discover {cd.GROUP}/{cd.VERSION}", seconds=self._timeouts.request))
        except ApiException as exc:
            if exc.status == 404 and self._simulated:
                self._say_once(logging.INFO, "kubeapi: the simulated cluster has no ComputeDomains in this "
                                             "scenario (the gb200-domain scenario has one)")
            elif exc.status == 404:
                self._say_once(logging.INFO, f"kubeapi: {cd.GROUP}/{cd.VERSION} is not served (NVIDIA's ComputeDomain "
                                             f"CRDs are not installed): no ComputeDomain metrics until they are")
            else:
                why = str(api_error(exc, f"discover {cd.GROUP}")).removeprefix("kubeapi: ")
                self._say_once(logging.WARNING, f"kubeapi: ComputeDomains not read: {why} (the rest of the cluster "
                                                "view is)")
            return
        except (urllib3.exceptions.HTTPError, OSError, SourceError) as exc:
            error = exc if isinstance(exc, SourceError) else unreachable(exc)
            self._say_once(logging.WARNING, f"kubeapi: ComputeDomains not read: {str(error).removeprefix('kubeapi: ')}")
            return
        started: list[Reflector[Any]] = []
        try:
            if cd.DOMAINS in found and self._domains is None:
                domains: Reflector[model.ComputeDomain] = self._reflector(
                    cd.DOMAINS, client, f"{path}/{cd.DOMAINS}", None, cd.compute_domain_from_dict, self._timeouts,
                    self.requests, on_update=self._bump)
                domains.list_once()
                started.append(domains)
            if cd.CLIQUES in found and self._cliques is None:
                # The driver namespace is the Helm release's: list every namespace, only labelled cliques.
                cliques: Reflector[model.ComputeDomainClique] = self._reflector(
                    cd.CLIQUES, client, f"{path}/{cd.CLIQUES}", None, cd.clique_from_dict, self._timeouts,
                    self.requests, on_update=self._bump, label_selector=DOMAIN_UID_LABEL)
                cliques.list_once()
                started.append(cliques)
        except SourceError as exc:
            self._say_once(logging.WARNING, f"kubeapi: ComputeDomains not read: {str(exc).removeprefix('kubeapi: ')} "
                                            "(the rest of the cluster view is)")
            return
        for reader in started:
            reader.start(self._stop)
            if reader.kind == cd.DOMAINS:
                self._domains = reader
            else:
                self._cliques = reader
        self.compute_domain_resources = frozenset(
            name for name, reader in ((cd.DOMAINS, self._domains), (cd.CLIQUES, self._cliques)) if reader)
        if self._domains is not None and self._cliques is not None:
            self._domains_due = None
        if started:
            self._bump()
            self._say_once(logging.INFO, f"kubeapi: reading {' and '.join(sorted(self.compute_domain_resources))} "
                                         f"from {cd.GROUP}/{cd.VERSION}")

    def _say_once(self, level: int, message: str) -> None:
        if message != self._domains_said:
            self._domains_said = message
            self._log.log(level, "%s", message)

    # --- node labels: only for slices that select nodes by label ---------------------------------------

    def _refresh_node_labels(self) -> None:
        """GET this node (RBAC ``get nodes``) when a slice selects nodes by label, again every
        ``claim_refresh``. Not allowed: logged once; such slices are taken as not covering it."""
        assert self._nodeless_slices is not None
        if not any(_needs_labels(s) for s in self._nodeless_slices.snapshot()):
            return
        now = self._monotonic()
        if now < self._node_labels_due:
            return
        self._node_labels_due = now + self._claim_refresh
        self.requests["get nodes"] += 1
        assert self._client is not None
        try:
            response = http.get(self._client, f"{http.NODES_PATH}/{{name}}", timeout=self._timeouts.request,
                                path_params={"name": self.node_name})
            labels: dict[str, str] | None = node_labels(read_json(response, "get nodes", MAX_OBJECT_BYTES,
                                                                          self._timeouts.request))
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise api_error(exc, f"get nodes {self.node_name}") from None
            if not self._node_warned:
                self._node_warned = True
                self._log.warning("kubeapi: cannot read node %s (HTTP %s): ResourceSlices that select nodes by "
                                  "label are not shown (grant get on nodes)", self.node_name, exc.status)
            labels = None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise unreachable(exc) from None
        if labels != self._node_labels:
            self._node_labels = labels
            self._bump()

    def _check_watches(self) -> None:
        for reflector in (self._slices, self._nodeless_slices, self._pods):
            if reflector is not None and reflector.error:
                raise SourceError(reflector.error)
        # The optional kinds fail quietly (their view is a bonus), but one past its object cap is
        # the API server sending without end: said, as for the others.
        for optional in (self._taint_rules, self._domains, self._cliques):
            if optional is not None and optional.over_limit:
                raise SourceError(optional.error)

    # --- claims ---------------------------------------------------------------------------------------

    def _pod_changed(self, key: str, old: model.PodInfo | None, new: model.PodInfo | None) -> None:
        if new is not None:
            self._log_health_messages(old, new)
        # A pod that appears (or changes its claims) may use a claim re-created under an old name,
        # or one whose allocation changed: fetch its claims again instead of waiting for the refresh.
        if new is None or (old is not None and (old.uid, old.claims) == (new.uid, new.claims)):
            return
        with self._stale_lock:
            self._stale.update((new.namespace, c) for c in new.claims)

    def _log_health_messages(self, old: model.PodInfo | None, new: model.PodInfo) -> None:
        """The kubelet's health ``message`` (1.36+) is free text: a label would make a series per
        wording, so it is logged, once each time an entry (device, health, message) appears."""
        before = {(c.name, h) for c in old.containers for h in c.health} if old else set()
        for ctr in new.containers:
            for h in ctr.health:
                if h.message and (ctr.name, h) not in before:
                    device = h.cdi_id or f"{h.driver}/{h.pool}/{h.device}"
                    self._log.log(logging.WARNING if h.health == "Unhealthy" else logging.INFO,
                                  "kubeapi: pod %s/%s container %s: device %s of claim %s is %s: %s",
                                  new.namespace, new.name, ctr.name, device, h.claim, h.health, h.message)

    def _wanted_claims(self) -> set[tuple[str, str]]:
        assert self._pods is not None
        wanted = {(p.namespace, c) for p in self._pods.snapshot() if not p.terminal for c in p.claims}
        try:
            wanted.update((ns, name) for ns, name in self._claim_hints() if ns and name)
        except Exception:  # noqa: BLE001 - hints are a bonus; the pod watch is the source of truth
            self._log.debug("claim hints failed", exc_info=True)
        return wanted

    def _refresh_claims(self) -> None:
        wanted = self._wanted_claims()
        for key in self._claims.keys() - wanted:
            del self._claims[key]  # no local pod uses it: forget it, no request needed
            self._bump()
        with self._stale_lock:
            stale, self._stale = self._stale & wanted, set()
        now = self._monotonic()
        for key in sorted(wanted):
            cached = self._claims.get(key)
            if cached is None or key in stale or now >= cached.due_at:
                self._fetch_claim(*key, now)

    def _fetch_claim(self, namespace: str, name: str, now: float) -> None:
        self.requests["get resourceclaims"] += 1
        try:
            assert self._client is not None and self.api_version is not None
            response = http.get_claim(self._client, self.api_version, namespace, name,
                                      timeout=self._timeouts.request)
            body = read_json(response, "get resourceclaims", MAX_OBJECT_BYTES, self._timeouts.request)
            version = self.api_version
            info: model.ClaimInfo | None = readable(lambda obj: claim_from_dict(obj, version), body,
                                                    "resourceclaims", f"{namespace}/{name}", self._unreadable)
        except ApiException as exc:
            if exc.status != 404:
                raise api_error(exc, f"get resourceclaims {namespace}/{name}") from None
            info = None  # not created yet, or deleted: asked again on the next pod change or refresh
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise unreachable(exc) from None
        old = self._claims.get((namespace, name))
        due = now + self._claim_refresh * random.uniform(1.0, 1.0 + REFRESH_SPREAD)
        self._claims[(namespace, name)] = _CachedClaim(info, due)
        if old is None or old.info != info:
            self._bump()

    # --- the claim census: are the claims prepared here still there? ---------------------------------

    def _refresh_census(self) -> None:
        """List the cluster's claims when a prepared claim UID is not explained by a local pod's claim
        (see the module docstring); forget the census when none is left."""
        try:
            prepared = set(self._prepared_claims())
        except Exception:  # noqa: BLE001 - a bonus, as the claim hints: the rest of the view goes on
            self._log.debug("prepared claim UIDs failed", exc_info=True)
            return
        known = {c.info.uid for c in self._claims.values() if c.info is not None and c.info.results}
        unexplained = frozenset(prepared - known)
        if not unexplained:
            if self._census is not None:
                self._census = None
                self._bump()
            return
        now = self._monotonic()
        asked = self._census.asked if self._census is not None else frozenset()
        # A claim the last list found still there while no local pod uses it is most often one being
        # deleted or deallocated right then (its pod just went): asked again once, CENSUS_MIN_S later.
        present = frozenset(c.uid for c in self._census.found) if self._census is not None else frozenset()
        recheck = (present & unexplained) - self._rechecked
        since = now - self._census_at
        due = since >= self._claim_refresh or (since >= CENSUS_MIN_S and (not unexplained <= asked or recheck))
        if not due:
            return
        self._census_at = now  # a failed list waits as long as a good one: no request storm
        self._rechecked = (self._rechecked | recheck) & unexplained
        version = self.api_version
        assert self._client is not None and version is not None

        def wanted(obj: Mapping[str, Any]) -> model.ClaimInfo | None:
            meta = obj.get("metadata")
            uid = meta.get("uid") if isinstance(meta, Mapping) else None
            return claim_from_dict(obj, version) if uid in unexplained else None

        census: Reflector[model.ClaimInfo] = self._reflector(
            "resourceclaims", self._client, f"{http.GROUP_PATH}/{version}/resourceclaims", None, wanted,
            self._timeouts, self.requests, page_size=CENSUS_PAGE)
        try:
            census.list_once(self._stop)
        except SourceError as exc:
            # Not allowed (a chart before list on resourceclaims) or failing: the rest of the view goes
            # on; without a census no prepared claim is called orphaned.
            message = f"kubeapi: the claim census failed: {str(exc).removeprefix('kubeapi: ')} (claims prepared " \
                      "on this node are not checked against the API server until it works)"
            if message != self._census_said:
                self._census_said = message
                self._log.warning("%s", message)
            return
        self._census_said = ""
        found = tuple(sorted(census.snapshot(), key=lambda c: (c.namespace, c.name)))
        self._census = model.ClaimCensus(unexplained, found, self._wall_clock())
        self._bump()

    # --- snapshot -------------------------------------------------------------------------------------

    def _bump(self) -> None:
        with self._revision_lock:  # watch threads and collect both bump it
            self._revision += 1

    def _build_snapshot(self) -> model.ClusterSnapshot:
        revision = self._revision
        if self._snapshot is not None and self._snapshot[0] == revision:
            return self._snapshot[1]  # nothing changed: the same object, so the join sees no churn
        assert self._slices is not None and self._pods is not None and self._nodeless_slices is not None
        listed = current_slices([*self._slices.snapshot(), *self._nodeless_slices.snapshot()])
        claims = tuple(sorted((c.info for c in self._claims.values() if c.info is not None),
                              key=lambda c: (c.namespace, c.name)))
        domains, cliques = cd.for_node(self._domains.snapshot() if self._domains else (),
                                       self._cliques.snapshot() if self._cliques else (), referenced_domains(claims))
        snapshot = model.ClusterSnapshot(
            node=self.node_name,
            api_version=self.api_version or "",
            slices=slices_for_node(listed, self.node_name, self._node_labels),
            claims=claims,
            pods=tuple(sorted(self._pods.snapshot(), key=lambda p: (p.namespace, p.name))),
            taint_rules=tuple(sorted(self._taint_rules.snapshot() if self._taint_rules else (),
                                     key=lambda r: r.name)),
            compute_domains=domains,
            compute_domain_cliques=cliques,
            claim_census=self._census,
        )
        self._snapshot = (revision, snapshot)
        return snapshot

    def _fail(self, message: str) -> None:
        self._backoff.failed()
        self._last_error = message


# --- helpers ------------------------------------------------------------------------------------------



def _needs_labels(sl: model.ResourceSliceInfo) -> bool:
    placements = [sl.placement, *(d.placement for d in sl.devices if d.placement is not None)]
    return any(p.node_selector is not None and p.node_selector.needs_labels for p in placements)

