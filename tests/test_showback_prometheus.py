"""Showback against a real Prometheus: the recording rules and ``dra-exporter report`` end to end.

- A simulated week (claims that start and end, whole GPUs and MIG devices, a claim shared by two
  pods, idle stretches, an unclaimed busy GPU) is written as OpenMetrics, backfilled with ``promtool
  tsdb create-blocks-from openmetrics``, the recording rules backfilled over it with ``promtool tsdb
  create-blocks-from rules``; the report's totals must match figures computed here from the
  scenario's own definition (not from the code under test), to within one step — from the rules,
  and from the raw series alone.
- ``serve --simulate`` scraped every second for half a minute with the rules loaded: ``report --since 30s``
  gives each demo claim its devices × share × time.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from deploy_tools import RECORDING_RULES, recording_rules_every, require_tool, running_exporter
from promharness import PromServer, free_port, start_prometheus

H200, H100 = "NVIDIA H200", "NVIDIA H100"


def report(url: str, *args: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "dra_exporter.cli", "report", "--prometheus", url,
                           "--format", "json", *args], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    doc["stderr"] = proc.stderr
    return doc  # type: ignore[no-any-return]


def by_claim(doc: dict[str, object]) -> dict[tuple[str, str], dict[str, float]]:
    return {(c["namespace"], c["claim"]): c for c in doc["claims"]}  # type: ignore[attr-defined, index]


# --- a simulated week, backfilled -------------------------------------------------------------

STEP = 300  # the scenario's scrape interval, the rules' backfill interval and the report's step
HOUR = 3600


@dataclass(frozen=True)
class Device:
    node: str
    uuid: str
    gpu: str
    profile: str = ""
    model: str = H200
    parent: str = ""

    @property
    def share(self) -> float:
        # Written out from the profile names, not from the rules: 1 for a whole GPU, slices / 7.
        return {"": 1.0, "3g.71gb": 3 / 7, "1g.18gb": 1 / 7, "3g.40gb": 3 / 7}[self.profile]


A0, A1 = Device("node-a", "GPU-a0", "0"), Device("node-a", "GPU-a1", "1")
A2 = Device("node-a", "GPU-a2", "2")  # MIG-enabled: only its MIG devices are held
A2_0 = Device("node-a", "MIG-a2-0", "2", "3g.71gb", parent="GPU-a2")
A2_1 = Device("node-a", "MIG-a2-1", "2", "3g.71gb", parent="GPU-a2")
B0, B2 = Device("node-b", "GPU-b0", "0", model=H100), Device("node-b", "GPU-b2", "2", model=H100)
B1 = Device("node-b", "GPU-b1", "1", model=H100)
B1_0 = Device("node-b", "MIG-b1-0", "1", "1g.18gb", H100, "GPU-b1")
B1_1 = Device("node-b", "MIG-b1-1", "1", "3g.40gb", H100, "GPU-b1")
DEVICES = (A0, A1, A2, A2_0, A2_1, B0, B1, B1_0, B1_1, B2)
PARENTS = {A2.uuid, B1.uuid}


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    devices: tuple[Device, ...]
    pods: tuple[str, ...]
    hours: tuple[int, int]
    busy: tuple[tuple[int, int, float], ...]
    """(from hour, to hour, utilisation) stretches; the rest of its life it is idle (0)."""

    def util(self, hour: float) -> float:
        return next((u for a, b, u in self.busy if a <= hour < b), 0.0)


WEEK = 168
CLAIMS = (
    Claim("ml", "train", (A0, A1), ("train-0",), (0, 72), ((0, 48, 0.8),)),
    Claim("ml", "train-2", (A0, A1), ("train-2-0",), (100, WEEK), ((100, 150, 0.9),)),  # idle since 150 h
    Claim("inference", "vllm", (A2_0,), ("vllm-0",), (0, WEEK), ((0, WEEK, 0.5),)),
    Claim("inference", "embed", (B1_0,), ("embed-0",), (24, 120), ((24, 120, 0.25),)),
    Claim("research", "notebook", (B0,), ("alice", "bob"), (0, WEEK), ()),  # shared, idle all week
    Claim("batch", "job-1", (B1_1,), ("job-1",), (10, 12), ((10, 12, 1.0),)),
    Claim("batch", "job-2", (B1_1,), ("job-2",), (30, 33), ((30, 33, 1.0),)),
)
TEAMS = {"ml": "platform", "inference": "serving", "research": "platform"}
UNCLAIMED_UTIL = 0.3  # GPU-b2 and the free MIG device are busy without a claim: never counted


def _labels(**kw: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in kw.items() if v) + "}"


def week_openmetrics(t0: int) -> str:
    """Every series of the scenario at STEP intervals over [t0, t0 + WEEK h)."""
    grid = range(t0, t0 + WEEK * HOUR, STEP)
    out: list[str] = []

    def family(name: str, series: dict[str, list[tuple[int, float]]]) -> None:
        out.append(f"# TYPE {name} gauge")
        for labels, points in series.items():
            out.extend(f"{name}{labels} {v} {t}" for t, v in points)

    def holder(t: int, d: Device) -> Claim | None:
        return next((c for c in CLAIMS if d in c.devices and c.hours[0] * HOUR <= t - t0 < c.hours[1] * HOUR), None)

    info = {_labels(instance=d.node, job="dra-exporter", uuid=d.uuid, gpu=d.gpu, model=d.model, profile=d.profile,
                    parent_uuid=d.parent, mig_mode="enabled" if d.uuid in PARENTS else ""): [(t, 1.0) for t in grid]
            for d in DEVICES}
    up: dict[str, list[tuple[int, float]]] = {}
    util: dict[str, list[tuple[int, float]]] = {}
    sm: dict[str, list[tuple[int, float]]] = {}
    consumers: dict[str, list[tuple[int, float]]] = {}
    for t in grid:
        for d in DEVICES:
            c = holder(t, d)
            attribution = {"namespace": c.namespace, "claim": c.name,
                           "pod": c.pods[0] if len(c.pods) == 1 else ""} if c else {}
            labels = _labels(instance=d.node, job="dra-exporter", uuid=d.uuid, gpu=d.gpu, profile=d.profile,
                             parent_uuid=d.parent, **attribution)
            up.setdefault(labels, []).append((t, 1.0))
            busy = c.util((t - t0) / HOUR) if c else UNCLAIMED_UTIL
            (sm if d.profile else util).setdefault(labels, []).append((t, busy))
        for c in CLAIMS:
            if c.hours[0] * HOUR <= t - t0 < c.hours[1] * HOUR:
                for pod in c.pods:
                    labels = _labels(instance=c.devices[0].node, job="dra-exporter", namespace=c.namespace,
                                     claim=c.name, pod=pod, container="main")
                    consumers.setdefault(labels, []).append((t, 1.0))
    family("dra_gpu_info", info)
    family("dra_gpu_up", up)
    family("dra_gpu_utilization_ratio", util)
    family("dra_gpu_sm_active_ratio", sm)
    family("dra_claim_consumer_info", consumers)
    # kube-state-metrics' pod labels (--metric-labels-allowlist=pods=[team]): the batch pods have none.
    family("kube_pod_labels", {_labels(job="kube-state-metrics", namespace=c.namespace, pod=pod,
                                       label_team=TEAMS[c.namespace]): [(t, 1.0) for t in grid]
                               for c in CLAIMS for pod in c.pods if c.namespace in TEAMS})
    out.append("# EOF")
    return "\n".join(out) + "\n"


def expected(claim: Claim) -> tuple[float, float]:
    """GPU-hours held and busy, from the scenario's definition."""
    share = sum(d.share for d in claim.devices)
    held = share * (claim.hours[1] - claim.hours[0])
    busy = share * sum((b - a) * u for a, b, u in claim.busy)
    return held, busy


def _rule_levels(path: Path) -> list[list[dict[str, object]]]:
    """The rules split so each level reads only earlier ones: promtool backfills a rule from stored
    data, so a rule on another rule's output needs that output in the TSDB first."""
    rules = [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]
    level: dict[str, int] = {}
    for rule in rules:  # the file lists a rule after those it reads
        reads = [level[r["record"]] for r in rules[: rules.index(rule)]
                 if re.search(rf"(?<![\w:]){re.escape(r['record'])}(?![\w:])", rule["expr"])]
        level[rule["record"]] = 1 + max(reads, default=-1)
    return [[r for r in rules if level[r["record"]] == n] for n in range(max(level.values()) + 1)]


def backfill(work: Path, openmetrics: str, start: int, end: int, interval: int,
             extra_args: Sequence[str] = ()) -> PromServer:
    """A Prometheus over ``openmetrics`` with the recording rules backfilled every ``interval``
    seconds over [start, end]; the caller stops it. ``extra_args`` go to every Prometheus started
    (a retention for data older than the default 15 days)."""
    promtool = require_tool("promtool", "apt-get install -y prometheus")
    binary = require_tool("prometheus", "apt-get install -y prometheus")
    tsdb = work / "tsdb"
    source = work / "series.om"
    source.write_text(openmetrics)
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
                   check=True, capture_output=True, timeout=300)
    levels = _rule_levels(RECORDING_RULES)
    for n in range(len(levels)):
        server = start_prometheus(binary, work / f"prom-{n}", [], "5m", tsdb=tsdb, extra_args=extra_args)
        # Same group name and file each pass: Prometheus offsets a group's evaluations by a hash of
        # both, and levels evaluated at different offsets would each lag the one before.
        group = [{"name": "showback", "rules": levels[n]}]
        out = work / f"rules-{n}"
        try:
            subprocess.run([promtool, "tsdb", "create-blocks-from", "rules", f"--url={server.url}",
                            # an hour either side: promtool leaves out the edges of its range
                            f"--start={start - HOUR}", f"--end={end + HOUR}", f"--output-dir={out}",
                            str(recording_rules_every(f"{interval}s", work, group))],
                           check=True, capture_output=True, timeout=300)
        finally:
            server.stop()
        for block in out.iterdir():
            shutil.move(str(block), tsdb / block.name)
    return start_prometheus(binary, work / f"prom-{len(levels)}", [], "5m", tsdb=tsdb, extra_args=extra_args)


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PromServer, int]]:
    t0 = (int(time.time()) // HOUR - WEEK - 2) * HOUR  # a week that ended two hours ago, on whole hours
    server = backfill(tmp_path_factory.mktemp("week"), week_openmetrics(t0), t0, t0 + WEEK * HOUR, STEP)
    try:
        yield server, t0
    finally:
        server.stop()


def _window(t0: int) -> list[str]:
    return ["--start", str(t0), "--end", str(t0 + WEEK * HOUR), "--step", f"{STEP}s"]


def _check_against_the_scenario(doc: dict[str, object], t0: int) -> None:
    got = by_claim(doc)
    assert set(got) == {(c.namespace, c.name) for c in CLAIMS}, "unclaimed devices never count"
    one_step = STEP / HOUR
    for claim in CLAIMS:
        held, busy = expected(claim)
        share = sum(d.share for d in claim.devices)
        row = got[(claim.namespace, claim.name)]
        assert row["gpu_hours_held"] == pytest.approx(held, abs=share * one_step + 1e-5), claim.name
        assert row["gpu_hours_busy"] == pytest.approx(busy, abs=share * one_step + 1e-5), claim.name
    namespaces = {n["namespace"]: n for n in doc["namespaces"]}  # type: ignore[attr-defined]
    for ns in {c.namespace for c in CLAIMS}:
        mine = [c for c in CLAIMS if c.namespace == ns]
        held = sum(expected(c)[0] for c in mine)
        slack = sum(sum(d.share for d in c.devices) for c in mine) * one_step + 1e-5
        assert namespaces[ns]["gpu_hours_held"] == pytest.approx(held, abs=slack), ns
    # The shared notebook GPU counts once (168 GPU-hours, not 336), and sat idle all week.
    assert got[("research", "notebook")]["idle_share"] == 1.0
    idle = {(c["namespace"], c["claim"]): c for c in doc["idle_claims"]}  # type: ignore[attr-defined]
    assert set(idle) == {("ml", "train-2"), ("research", "notebook")}, "claims sitting idle at the end"
    notebook, train2 = idle[("research", "notebook")], idle[("ml", "train-2")]
    assert notebook["idle_since_before_window"] and notebook["pods"] == ["alice", "bob"], notebook
    assert notebook["devices"] == "1 × GPU"
    since = time.mktime(time.strptime(train2["idle_since"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert abs(since - (t0 + 150 * HOUR)) <= STEP and not train2["idle_since_before_window"]
    assert train2["devices"] == "2 × GPU" and train2["gpu_equivalents"] == 2
    assert [c["claim"] for c in doc["idle_claims"]] == ["notebook", "train-2"], "idle longest first"  # type: ignore[attr-defined]


@pytest.mark.prometheus
@pytest.mark.slow
def test_a_backfilled_week_reports_the_scenarios_figures_from_the_rules(week: tuple[PromServer, int]) -> None:
    server, t0 = week
    doc = report(server.url, *_window(t0))
    assert doc["source"] == "recording rules" and doc["stderr"] == ""
    _check_against_the_scenario(doc, t0)


@pytest.mark.prometheus
@pytest.mark.slow
def test_without_the_rules_the_raw_series_give_the_same_figures_and_say_so(week: tuple[PromServer, int]) -> None:
    server, t0 = week
    doc = report(server.url, *_window(t0), "--raw")
    assert doc["source"] == "raw series" and "raw series" in str(doc["stderr"])
    _check_against_the_scenario(doc, t0)


@pytest.mark.prometheus
@pytest.mark.slow
def test_a_price_file_prices_each_model_and_a_mig_device_pays_its_share(
        week: tuple[PromServer, int], tmp_path: Path) -> None:
    server, t0 = week
    prices = tmp_path / "prices.yaml"
    prices.write_text(f'"{H200}": 4.0\n"{H100}": 2.5\n')
    got = by_claim(report(server.url, *_window(t0), "--price-file", str(prices)))
    for claim in CLAIMS:
        held = expected(claim)[0]
        price = {H200: 4.0, H100: 2.5}[claim.devices[0].model]
        share = sum(d.share for d in claim.devices)
        assert got[(claim.namespace, claim.name)]["cost"] == pytest.approx(
            held * price, abs=share * STEP / HOUR * price + 1e-5), claim.name


@pytest.mark.prometheus
@pytest.mark.slow
def test_group_by_a_pod_label_sums_the_claims_of_each_value(week: tuple[PromServer, int]) -> None:
    server, t0 = week
    doc = report(server.url, *_window(t0), "--group-by", "label:team")
    assert doc["groups"]["label"] == "label_team"  # type: ignore[index]
    got = {g["value"]: g for g in doc["groups"]["values"]}  # type: ignore[index]
    assert set(got) == {"platform", "serving", ""}, "the batch pods carry no team label"
    for team in ("platform", "serving", ""):
        mine = [c for c in CLAIMS if TEAMS.get(c.namespace, "") == team]
        held = sum(expected(c)[0] for c in mine)
        slack = sum(sum(d.share for d in c.devices) for c in mine) * STEP / HOUR + 1e-5
        assert got[team]["gpu_hours_held"] == pytest.approx(held, abs=slack), team
    claims = {(c["namespace"], c["claim"]): c["label_team"] for c in doc["claims"]}  # type: ignore[attr-defined]
    assert claims[("research", "notebook")] == "platform" and claims[("batch", "job-1")] == ""


# --- periodic load: every sample counts, not the one at the evaluation's instant ---------------

SCRAPE = 15  # seconds; the scrapes fall 7 s after each minute, as a real target's offset would
CYCLE = (1.0, 0.9, 0.6, 0.7)  # a 60 s load cycle, one value per scrape: a mean of 0.8
PERIODIC = (  # (claim, device, share): a whole GPU by its utilisation, a MIG device by SM activity
    ("ranks", Device("gb-0", "GPU-g0", "0", model="NVIDIA GB200"), 1.0),
    ("slice", Device("gb-0", "MIG-g1-0", "1", "3g.93gb", "NVIDIA GB200", "GPU-g1"), 3 / 7),
)
PERIODIC_HOURS = 2


def periodic_openmetrics(t0: int) -> str:
    """Series from 10 minutes before t0 to 10 after the window: each scrape reads the cycle's step
    it falls in, so the mean of the samples is the curve's mean."""
    grid = range(t0 - 600 + 7, t0 + PERIODIC_HOURS * HOUR + 600, SCRAPE)
    out: list[str] = []
    for name in ("dra_gpu_info", "dra_gpu_up", "dra_gpu_utilization_ratio", "dra_gpu_sm_active_ratio"):
        out.append(f"# TYPE {name} gauge")
        for claim, d, _ in PERIODIC:
            if name == "dra_gpu_info":
                labels = _labels(instance=d.node, job="dra-exporter", uuid=d.uuid, gpu=d.gpu, model=d.model,
                                 profile=d.profile, parent_uuid=d.parent)
            else:
                if name == ("dra_gpu_sm_active_ratio" if not d.profile else "dra_gpu_utilization_ratio"):
                    continue
                labels = _labels(instance=d.node, job="dra-exporter", uuid=d.uuid, gpu=d.gpu, profile=d.profile,
                                 parent_uuid=d.parent, namespace="mpi", claim=claim, pod=f"{claim}-0")
            for t in grid:
                value = 1.0 if name in ("dra_gpu_info", "dra_gpu_up") else CYCLE[(t - t0) % 60 // SCRAPE]
                out.append(f"{name}{labels} {value} {t}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


@pytest.mark.prometheus
@pytest.mark.slow
def test_periodic_load_is_busy_by_the_mean_of_every_sample_from_the_rules_and_the_raw_series(
        tmp_path: Path) -> None:
    t0 = (int(time.time()) // HOUR - PERIODIC_HOURS - 2) * HOUR
    end = t0 + PERIODIC_HOURS * HOUR
    server = backfill(tmp_path, periodic_openmetrics(t0), t0 - 600, end + 600, 60)
    try:
        window = ["--start", str(t0), "--end", str(end), "--step", "60s"]
        docs = {"rules": report(server.url, *window), "raw": report(server.url, *window, "--raw")}
    finally:
        server.stop()
    assert docs["rules"]["source"] == "recording rules" and docs["raw"]["source"] == "raw series"
    mean = sum(CYCLE) / len(CYCLE)
    for how, doc in docs.items():
        got = by_claim(doc)
        for claim, _, share in PERIODIC:
            held = share * PERIODIC_HOURS
            assert got[("mpi", claim)]["gpu_hours_held"] == pytest.approx(held, rel=0.01), (how, claim)
            assert got[("mpi", claim)]["gpu_hours_busy"] == pytest.approx(held * mean, rel=0.01), (how, claim)


# --- end to end: the simulated node scraped for half a minute -----------------------------------

DEMO = {  # demo.yaml: each claim's devices and their shares (the admin-access claim holds nothing)
    ("ml-training", "llama-train-gpus"): 4.0,
    ("inference", "vllm-small-0-gpu"): 3 / 7,
    ("inference", "embed-0-gpu"): 1 / 7,
    ("inference", "embed-1-gpu"): 1 / 7,
    ("inference", "embed-2-gpu"): 1 / 7,
    ("batch", "tokenize-job-7-gpu"): 1 / 7,
    ("research", "shared-notebook-gpu"): 1.0,
}


DEMO_TEAMS = {"ml-training": "platform", "inference": "serving", "research": "research", "batch": ""}
"""demo.yaml's pods' ``team`` label, by namespace (the batch pod has none)."""
LIVE_SECONDS = 30


@pytest.fixture(scope="module")
def live_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, object]]]:
    """``serve --simulate`` (the demo node, ``--pod-labels team``) scraped every second with the rules
    loaded for half a minute: the report over that half minute from the rules, from the raw series,
    and grouped by the team label the exporter puts on consumer info (no kube-state-metrics here)."""
    binary = require_tool("prometheus", "apt-get install -y prometheus")
    work = tmp_path_factory.mktemp("live")
    with running_exporter("demo", free_port(), env={"DRA_EXPORTER_POD_LABELS": "team"}) as port:
        server = start_prometheus(binary, work / "prom", [f"127.0.0.1:{port}"], "1s",
                                  rule_files=[recording_rules_every("1s", work)])
        try:
            server.wait_for('dra_claim_consumer_info{label_team="platform"}', timeout=60)
            server.wait_for('namespace_claim:dra_gpus_held:sum{claim="llama-train-gpus"}', timeout=60)
            time.sleep(LIVE_SECONDS + 3)  # the window's recorded figures, and a little more for the first lookback
            window = ("--since", f"{LIVE_SECONDS}s", "--end", f"{time.time():.3f}")
            yield {"rules": report(server.url, *window), "raw": report(server.url, *window, "--raw"),
                   "team": report(server.url, *window, "--group-by", "label:team")}
        finally:
            server.stop()


@pytest.mark.prometheus
@pytest.mark.slow
def test_report_on_the_simulated_node_gives_devices_times_share_times_time(
        live_demo: dict[str, dict[str, object]]) -> None:
    doc, raw = live_demo["rules"], live_demo["raw"]
    assert doc["window"]["step_seconds"] == 1  # type: ignore[index]
    for source in (doc, raw):
        got = by_claim(source)
        assert set(got) == set(DEMO), source["source"]
        for key, share in DEMO.items():
            # devices x share x the window, to within one step (1 s) of the claim's share
            assert got[key]["gpu_hours_held"] == pytest.approx(share * LIVE_SECONDS / HOUR,
                                                               abs=share / HOUR + 1e-5), key
            assert 0 < got[key]["gpu_hours_busy"] < got[key]["gpu_hours_held"], key
    assert doc["source"] == "recording rules" and raw["source"] == "raw series"


@pytest.mark.prometheus
@pytest.mark.slow
def test_report_groups_by_the_team_label_the_exporter_itself_puts_on_consumer_info(
        live_demo: dict[str, dict[str, object]]) -> None:
    doc = live_demo["team"]
    assert doc["groups"]["label"] == "label_team"  # type: ignore[index]
    got = {g["value"]: g["gpu_hours_held"] for g in doc["groups"]["values"]}  # type: ignore[index]
    assert set(got) == set(DEMO_TEAMS.values()), "no kube-state-metrics here: the labels are the exporter's"
    for team in got:
        share = sum(s for (ns, _), s in DEMO.items() if DEMO_TEAMS[ns] == team)
        assert got[team] == pytest.approx(share * LIVE_SECONDS / HOUR, abs=share / HOUR + 1e-5), team
    teams = {(c["namespace"], c["claim"]): c["label_team"] for c in doc["claims"]}  # type: ignore[attr-defined]
    assert teams == {key: DEMO_TEAMS[key[0]] for key in DEMO}


# --- consumer info with the exporter's --pod-labels ----------------------------------------------------


def _split_test(rules: str, directory: Path, promtool: str) -> subprocess.CompletedProcess[str]:
    """recording-rules.test.yaml's first case, its pods labelled by team (the shared notebook's two
    pods by two teams), asking only for the per-pod split."""
    case = yaml.safe_load((RECORDING_RULES.parent / "recording-rules.test.yaml").read_text())["tests"][0]
    teams = {"alice": "nlp", "bob": "vision", "train-0": "platform"}
    for s in case["input_series"]:
        if s["series"].startswith("dra_claim_consumer_info{"):
            pod = re.search(r'pod="([^"]+)"', s["series"])[1]  # type: ignore[index]
            s["series"] = s["series"].replace("{", f'{{label_team="{teams[pod]}", ', 1)
    case["promql_expr_test"] = [t for t in case["promql_expr_test"]
                                if t["expr"] == "namespace_claim_pod:dra_gpus_held:split"]
    (directory / "rules.yaml").write_text(rules)
    (directory / "test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [case]}))
    return subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=directory, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.prometheus
def test_the_per_pod_split_drops_the_pod_labels_the_exporter_was_told_to_export(promtool: str,
                                                                                 tmp_path: Path) -> None:
    from dra_exporter import catalog, showback

    labelled = _split_test(showback.rules_yaml(catalog.PodLabels(("team",))), tmp_path, promtool)
    assert labelled.returncode == 0, labelled.stdout + labelled.stderr
    # The default rules cannot match label_team: the split would have no series at all.
    plain = _split_test(showback.rules_yaml(), tmp_path, promtool)
    assert plain.returncode != 0 and "namespace_claim_pod:dra_gpus_held:split" in plain.stdout + plain.stderr
