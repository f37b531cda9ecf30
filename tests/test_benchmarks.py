"""The benchmark suite never rots, and the fast renderer it justifies writes what prometheus_client writes.

- ``sinks.exposition`` against ``benchmarks.baseline.render_reference`` (prometheus_client) on
  arbitrary frames: byte-identical text and OpenMetrics, and bounded caches under churn;
- the ``scale`` scenario is what its generator writes and has the promised size;
- each benchmark of ``python -m benchmarks.run`` runs in a tiny configuration and writes
  the JSON shape docs/performance.md describes, with figures that are plausible (non-zero, finite,
  in bounds no correct measurement leaves); timings are never compared with a target;
- the pure parts of ``benchmarks/gpu/bench_nvml.py`` work against the fake NVML.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.utils import floatToGoString

from dra_exporter import catalog, model
from dra_exporter.printable import without_controls
from dra_exporter.sinks import exposition
from dra_exporter_sim import load_scenario
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.fake_nvml import FakeNvml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `benchmarks` is a top-level folder, not part of the package
    sys.path.insert(0, str(REPO))

from benchmarks import make_scale_scenario, run  # noqa: E402
from benchmarks.baseline import render_reference  # noqa: E402
from benchmarks.nvml_timing import TimedNvml  # noqa: E402

# --- the renderer is byte-identical to prometheus_client ------------------------------------

label_values = st.one_of(
    st.sampled_from(["", 'say "hi"', "back\\slash", "trailing\\", "new\nline", "\\n literally", "tab\tcr\r",
                     "ünïcødé ✓ 日本語 🚀", "}{,=\"", "# EOF", "nul\x00byte"]),
    st.text(max_size=30),
)
values = st.one_of(
    st.floats(width=64),  # NaN, ±Inf, ±0.0, subnormals, huge
    st.sampled_from([0.0, -0.0, 1.0, 1e6, 999999.9999999999, 1e16, 9999999999999998.0, 123456789012.0,
                     -1234567.0]),
    st.integers(min_value=-(2**53), max_value=2**53).map(float),
)


@st.composite
def frames(draw: Any) -> model.Frame:
    specs = draw(st.lists(st.sampled_from(catalog.CATALOG), min_size=1, max_size=6,
                          unique_by=lambda s: s.name))
    families = []
    for spec in specs:
        count = draw(st.integers(min_value=0, max_value=4))
        samples = {}
        for _ in range(count):
            labels = tuple((name, draw(label_values)) for name in spec.labels)
            samples[labels] = model.Sample(labels, draw(values))
        families.append(model.Family(spec.name, tuple(samples.values())))
    return model.Frame(tuple(families))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=frames())
def test_renderer_writes_exactly_what_prometheus_client_writes(frame: model.Frame) -> None:
    """Byte for byte, once control characters are replaced (which prometheus_client leaves raw, and a
    reader of a text stream then splits: ``printable.without_controls``)."""
    renderer = exposition.Renderer()
    shown = model.Frame(tuple(model.Family(f.name, tuple(
        model.Sample(tuple((k, without_controls(v)) for k, v in s.labels), s.value) for s in f.samples))
        for f in frame.families))
    for openmetrics in (False, True):
        expected = render_reference(shown, openmetrics=openmetrics)
        assert renderer.render(frame, openmetrics=openmetrics) == expected
    assert renderer.render_both(frame) == (render_reference(shown), render_reference(shown, openmetrics=True))


@given(value=values)
def test_values_are_formatted_as_prometheus_client_formats_them(value: float) -> None:
    assert exposition.format_value(value) == floatToGoString(value)


def _device_frame(pods: list[str], value: float) -> model.Frame:
    def labels(i: int, pod: str) -> model.Labels:
        return tuple((name, {"uuid": f"GPU-{i}", "pod": pod}.get(name, "")) for name in catalog.DEVICE_LABELS)

    samples = tuple(model.Sample(labels(i, pod), value) for i, pod in enumerate(pods))
    return model.Frame((model.Family(catalog.GPU_UTILIZATION.name, samples),))


def test_each_new_frame_is_rendered_afresh() -> None:
    renderer = exposition.Renderer()
    first = renderer.render(_device_frame(["a"], 0.25))
    # An equal but distinct frame object, and one with other values: never the cached bytes of another.
    assert renderer.render(_device_frame(["a"], 0.25)) == first
    second = renderer.render(_device_frame(["a"], 0.5))
    assert b" 0.5\n" in second and b" 0.25\n" not in second
    assert renderer.render(_device_frame(["b"], 0.5), openmetrics=True).endswith(b"# EOF\n")


def test_caches_stay_bounded_while_pods_churn() -> None:
    renderer = exposition.Renderer()
    for cycle in range(300):
        frame = _device_frame([f"pod-{cycle}-{i}" for i in range(10)], cycle + 0.5)
        assert renderer.render(frame) == render_reference(frame)
    # Each cycle brought 10 new label sets and a new value; the caches must have let the old ones go.
    assert len(renderer._labels) <= 10
    assert len(renderer._values) <= 10


def test_unknown_family_is_a_clear_error() -> None:
    with pytest.raises(exposition.UnknownMetricError, match="not_in_catalogue.*catalog"):
        exposition.render(model.Frame((model.Family("not_in_catalogue", (model.Sample((), 1.0),)),)))


# --- the scale scenario -----------------------------------------------------------------------


def test_scale_scenario_is_what_its_generator_writes() -> None:
    assert make_scale_scenario.main(["--check"]) == 0, "run: python3 -m benchmarks.make_scale_scenario"


def test_scale_scenario_has_the_promised_size() -> None:
    scenario = load_scenario("scale")
    assert len(scenario.gpus) == 8 and all(len(g.mig) == 7 for g in scenario.gpus)
    assert {m.profile for g in scenario.gpus for m in g.mig} == {"1g.18gb"}
    assert len(scenario.pods) == 120 and len(scenario.claims) == 150
    workload = [p for p in scenario.pods if (p.namespace, p.name) != (scenario.exporter_pod.namespace,
                                                                     scenario.exporter_pod.name)]
    assert all(sum(len(c.processes) for c in p.containers) == 2 for p in workload)
    assert any(len(c.claims) == 2 for p in workload for c in p.containers)  # some pods hold two claims
    consumers: dict[tuple[str, str], int] = {}
    for pod in workload:
        for claim in (c for container in pod.containers for c in container.claims):
            consumers[(pod.namespace, claim)] = consumers.get((pod.namespace, claim), 0) + 1
    assert max(consumers.values()) > 1  # some claims are shared
    churning = [p for p in workload if p.end is not None]
    assert len(churning) > 30 and len({p.start for p in churning}) > 30  # pods come and go over time


# --- the benchmarks run (shape and plausible figures, never timing targets) -------------------

TINY = ["--scenarios", "demo", "--scrapes", "3", "--baseline-scrapes", "2", "--paced-scrapes", "2",
        "--concurrency", "1",
        "--cycles", "2", "--serve-seconds", "1.5", "--serve-warmup-seconds", "0.5",
        "--scrape-interval-seconds", "1", "--drift-cycles", "6", "--drift-warmup-cycles", "2",
        "--drift-scenario", "demo",
        "--apiserver-seconds", "600", "--apiserver-step-seconds", "60", "--apiserver-polls", "2",
        "--gc-cycles", "3"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(run.BENCHMARKS))
def test_benchmark_runs_and_writes_its_json(name: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    assert run.main([*TINY, "--only", name, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == 1 and doc["machine"]["cpus"] >= 1 and doc["config"]["scenarios"] == ["demo"]
    entry = doc["benchmarks"][name]
    assert set(entry) >= {"description", "baseline", "status", "rows", "checks", "notes", "seconds",
                          "loadavg_1m"}
    assert isinstance(entry["description"], str) and entry["description"]
    for check in entry["checks"]:
        assert set(check) == {"target", "value", "limit", "unit", "higher_is_better", "met"}
        assert isinstance(check["value"], (int, float)) and isinstance(check["met"], bool)
    assert entry["status"] == "measured" and entry["rows"], "a measured benchmark has rows"
    _assert_rows(name, entry["rows"])
    printed = capsys.readouterr().out
    assert f"== {name}:" in printed and str(out) in printed


def _assert_rows(name: str, rows: list[dict[str, Any]]) -> None:
    numbers = {
        "scrape": ("p50_ms", "p99_ms", "idle_p50_ms", "idle_p99_ms", "baseline_p50_ms", "baseline_p99_ms",
                   "p50_ratio", "p99_ratio"),
        "cycle": ("cpu_ms",),
        "serve": ("cpu_core_fraction", "rss_mb", "baseline_cpu_core_fraction", "cpu_ratio"),
        "drift": ("rss_mb", "allocated_blocks"),
        "gc": ("collections", "max_pause_ms", "gc_ms_per_cycle", "cpu_ms_per_cycle", "tracked_objects"),
        "apiserver": ("requests_per_hour", "response_mb_per_hour", "list_slices", "list_pods", "list_claims",
                      "watch_slices", "watch_pods", "get_claims"),
    }[name]
    # Measurement rows (not drift's closing "end - warm-up" row, which may be negative).
    measured = [r for r in rows if all(k in r for k in numbers) and not isinstance(r.get("cycle"), str)]
    assert measured, f"no row of {name} has all of {numbers}: {rows}"
    for row in measured:
        for key in numbers:
            value = row[key]
            assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, (key, row)
    if name == "scrape":
        paced = [r for r in rows if r["mode"] == "prometheus-paced"]
        assert paced, "the paced (Prometheus-like) rows are missing"
        for row in paced:
            for key in ("p50_ms", "p99_ms", "gzip_on_scrape_p50_ms", "gzip_on_scrape_p99_ms", "p99_ratio"):
                assert isinstance(row[key], (int, float)) and math.isfinite(row[key]) and row[key] > 0, (key, row)
        kept_alive = [r for r in rows if r["mode"].startswith("keepalive-")]
        assert {r["mode"] for r in kept_alive} == {"keepalive-prometheus", "keepalive-text"}
        for row in kept_alive:
            for key in ("p50_ms", "p99_ms", "nagle_p50_ms", "nagle_p99_ms", "p99_ratio"):
                assert isinstance(row[key], (int, float)) and math.isfinite(row[key]) and row[key] > 0, (key, row)
    if name == "cycle":
        stages = {r["stage"] for r in rows}
        assert stages >= {"nvml", "podresources", "join", "render_text", "render_openmetrics", "total"}
    if name == "drift":
        assert rows[-1]["cycle"] == "drift (end - warm-up)"
    if name == "apiserver":
        ours, baseline = rows
        assert ours["list_claims"] == 0, "never a cluster-wide claim list"
        assert ours["watch_expected"] > 0 and ours["requests_ratio"] > 0 and ours["bytes_ratio"] > 0
        assert baseline["list_claims"] > 0 and baseline["requests_per_hour"] > 0
    _assert_plausible(name, measured)


def _positive(row: dict[str, Any], *keys: str) -> None:
    for key in keys:
        value = row[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, row)


#: Figures a run of each benchmark cannot have measured right at 0, infinity or beyond these bounds:
#: a counter that counts nothing (the apiserver benchmark's 0 MB/h and its infinite ratio, when the
#: product read bodies with read1() past the counting wrapper) fails here, not in docs/performance.md.
def _assert_plausible(name: str, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        for key, value in row.items():
            if key.endswith("_ratio") and isinstance(value, (int, float)):
                assert math.isfinite(value) and value > 0, (key, row)
        if name == "scrape":
            _positive(row, "p50_ms", "p99_ms", "baseline_p50_ms", "baseline_p99_ms")
            assert row["p50_ms"] <= row["p99_ms"] and row["idle_p50_ms"] <= row["idle_p99_ms"], row
        elif name == "cycle":
            _positive(row, "cpu_ms")
        elif name == "serve":
            _positive(row, "cpu_core_fraction", "baseline_cpu_core_fraction", "rss_mb")
            assert 10 < row["rss_mb"] < 4096, row  # a Python process serving the demo node
        elif name == "drift":
            assert 10 < row["rss_mb"] < 4096 and row["allocated_blocks"] > 1000, row
        elif name == "gc":
            _positive(row, "cpu_ms_per_cycle", "tracked_objects")
            assert row["gc_ms_per_cycle"] <= row["cpu_ms_per_cycle"], row
        elif name == "apiserver":
            # Every request has a body: a list is at least "{}", and ours lists slices and pods.
            _positive(row, "requests_per_hour", "response_mb_per_hour")
            assert row["response_mb_per_hour"] * 1e6 >= row["requests_per_hour"] * 2, row


def test_bad_arguments_are_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--only", "nonsense"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'nonsense'" in capsys.readouterr().err


# --- the GPU script's pure parts, against the fake NVML --------------------------------------


def _bench_nvml() -> ModuleType:
    path = REPO / "benchmarks" / "gpu" / "bench_nvml.py"
    spec = importlib.util.spec_from_file_location("bench_nvml", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_timed_nvml_passes_everything_through_and_counts_each_call() -> None:
    fake = FakeNvml(load_scenario("demo"), SimClock(60.0, frozen=True))
    timed = TimedNvml(fake)
    assert timed.NVMLError is fake.NVMLError and timed.NVML_SUCCESS == fake.NVML_SUCCESS
    timed.nvmlInit()
    count = timed.nvmlDeviceGetCount()
    with pytest.raises(fake.NVMLError):
        timed.nvmlDeviceGetHandleByIndex(count)  # errors pass through, and still count
    assert timed.calls == {"nvmlInit": 1, "nvmlDeviceGetCount": 1, "nvmlDeviceGetHandleByIndex": 1}
    assert timed.calls == fake.calls and timed.total_seconds > 0


def test_gpu_script_measures_a_cycle_against_its_nvml_floor(tmp_path: Path) -> None:
    bench = _bench_nvml()
    fake = FakeNvml(load_scenario("demo"), SimClock(60.0, frozen=True))
    result = bench.run(fake, cycles=2, interval=0.0, scrapes=0)
    cycle = result["cycle"]
    assert cycle["cycles"] == 2 and cycle["devices"] == 17 and cycle["models"] == ["NVIDIA H200"]
    assert 0 < cycle["nvml_floor_ms"] <= cycle["cycle_ms"]
    assert cycle["nvml_calls_per_cycle"] > 0 and cycle["top_calls"][0]["call"].startswith("nvml")
    assert result["scrape"]["status"].startswith("skipped")
    report = bench.format_report(result)
    assert "NVML calls (the floor)" in report and "exporter's own" in report
    path = bench.write_json(result, str(tmp_path))
    assert path is not None and json.loads(path.read_text())["cycle"] == cycle
    assert bench.write_json(result, None) is None


def test_gpu_script_says_when_nvitop_exporter_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench_nvml()
    monkeypatch.setenv("PATH", "/nonexistent")
    assert bench.nvitop_command(9400) is None


def test_gpu_script_without_nvml_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import pynvml

    bench = _bench_nvml()

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    assert bench.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NVML is not usable here" in err
