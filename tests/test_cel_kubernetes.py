"""Selectors run in Kubernetes' CEL environment for DRA (cluster/kubecel.py): what the API server admits
and the scheduler runs, the exporter runs alike or says it cannot ("not supported by this exporter"),
never "not placeable". The agreement with the real scheduler is tests/test_testbed_cel_corpus.py.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from dra_layouts import EXAMPLE, claim_obj, cluster_state, device_class, example_gpus, request, slice_obj

from dra_exporter.cluster import allocator as al
from dra_exporter.cluster.explain import explain, first_blocking, render_json, render_text
from dra_exporter.cluster.kubecel import Unsupported, translate
from dra_exporter.cluster.selectors import ClassSelector
from dra_exporter.model import ClusterPod, DeviceClassInfo, SliceDevice

GPU = SliceDevice("gpu-0", attributes=(("model", "H100 80GB HBM3"), ("index", "1"), ("driverVersion", "550.54.15"),
                                       ("example.com/numa", "1")),
                  attribute_kinds=(("index", "int"), ("driverVersion", "version"), ("example.com/numa", "int")),
                  capacity=(("memory", 80 * 2**30),))


def run(expression: str) -> bool | None:
    selector = ClassSelector(DeviceClassInfo("c", (expression,)))
    result = selector.matches(EXAMPLE, GPU)
    assert not selector.error, selector.error
    return result


@pytest.mark.parametrize(("expression", "expected"), [
    # An unknown domain is an empty map: has() is false, a field of it is missing, membership is exact.
    ("has(device.attributes['other.example.com'].model)", False),
    ("device.attributes['other.example.com'].size() == 0 && device.capacity['x.example.com'].size() == 0", True),
    ("device.attributes['other.example.com'].model == 'x'", None),
    ("!('other.example.com' in device.attributes) && 'example.com' in device.attributes", True),
    ("device.attributes['example.com'].numa == 1", True),
    # cel.bind, also nested and inside a string that looks like one
    (f"cel.bind(g, device.attributes['{EXAMPLE}'], g.index == 1 && g.model.startsWith('H100'))", True),
    ("cel.bind(a, 2, cel.bind(b, a * 3, b == 6))", True),
    ("device.driver != 'cel.bind(x, 1, x)'", True),
    # the string library, version 2, and format
    (f"device.attributes['{EXAMPLE}'].model.lowerAscii().split(' ')[0] == 'h100'", True),
    ("device.driver.indexOf('.') == 3 && device.driver.lastIndexOf('.') == 11", True),
    ("device.driver.replace('.example.com', '').upperAscii() == 'GPU'", True),
    ("device.driver.substring(0, 3) == 'gpu' && ' x '.trim() == 'x' && device.driver.charAt(0) == 'g'", True),
    ("'%s/%d/%.1f/%x'.format([device.driver, 3, 2.25, 255]) == 'gpu.example.com/3/2.2/ff'", True),
    ("'%d'.format(['x']) == 'x'", None),
    ("device.driver.substring(5, 2) == 'x'", None),
    # lists, sets, regular expressions
    ("[1, 2, 3].isSorted() && [4, 2].min() == 2 && [1, 2].sum() == 3 && ['a', 'b'].indexOf('b') == 1", True),
    ("sets.contains([device.driver, 'x'], [device.driver]) && device.driver.find('[a-z]+') == 'gpu'", True),
    # optional field and index selection
    (f"device.attributes['{EXAMPLE}'].?model.orValue('') == 'H100 80GB HBM3'", True),
    ("device.attributes['other.example.com'].?model.orValue('none') == 'none'", True),
    ("device.attributes[?'other.example.com'].hasValue()", True),  # the scheduler's map finds every domain
    ("device.attributes[?'example.com'].?numa.orValue(0) == 1 && {'a': 1}[?'b'].orValue(2) == 2", True),
    (f"device.attributes['{EXAMPLE}'].?missing.value() == 1", None),
    # IP and CIDR
    ("ip('10.0.0.1').family() == 4 && isIP('::1') && !isIP('1.2.3') && !isIP('::ffff:1.2.3.4')", True),
    ("cidr('10.0.0.0/8').containsIP('10.1.2.3') && cidr('10.0.0.5/8').masked() == cidr('10.0.0.0/8')", True),
    ("cidr('10.0.0.5/8').ip() == ip('10.0.0.5') && cidr('fd00::/8').prefixLength() == 8", True),
    ("ip('::1').isLoopback() && ip('ff02::1').isLinkLocalMulticast() && ip('8.8.8.8').isGlobalUnicast()", True),
    ("ip(device.driver).family() == 4", None),
    # quantity and semver, as before
    (f"device.capacity['{EXAMPLE}'].memory.compareTo(quantity('40Gi')) > 0", True),
    (f"device.attributes['{EXAMPLE}'].driverVersion.isGreaterThan(semver('540.0.0'))", True),
])
def test_kubernetes_cel_forms_run_as_the_scheduler_runs_them(expression: str, expected: bool | None) -> None:
    assert run(expression) is expected


def test_strings_and_comments_are_not_rewritten() -> None:
    untouched = "device.driver == 'a.?b' // cel.bind(x, 1, x)"
    assert translate(untouched) == (untouched, ())
    with pytest.raises(Unsupported):
        translate("[?optional.none(), 1].size() == 1")


@pytest.mark.parametrize("expression", [
    "url('https://example.com/a').getHost() == 'example.com'",  # the API server admits URLs
    "[1, 2].all(i, v, v > 0)",       # two-variable comprehensions: the library does not parse them
    "{?'a': optional.none()}.size() == 0",
])
def test_a_selector_the_exporter_cannot_run_is_not_supported_not_unplaceable(expression: str) -> None:
    state = cluster_state(example_gpus("n1", 2), device_class("cidr", expression),
                          claim_obj("waiting", [request(device_class_name="cidr")]))
    state = replace(state, pods=(ClusterPod("ml", "p", claims=("waiting",)),))
    (outcome,) = explain(state, [("ml", "waiting")])
    assert first_blocking(outcome) == ("gpu", al.UNSUPPORTED_SELECTOR)
    assert render_text([outcome]).startswith("ml/waiting: placeable or not: NOT KNOWN")
    assert "not supported by this exporter" in render_text([outcome])
    assert json.loads(render_json([outcome], single=True))["placeable"] is None


def test_has_on_another_drivers_domain_is_false_not_an_error() -> None:
    """The issue's case: a class over one driver's attributes, the other driver's device tried first."""
    nic = slice_obj("n1-nic", "a-nic.example.com", "n1-nic", [{"name": "nic-0", "attributes": {}}], node="n1")
    state = cluster_state(nic, example_gpus("n1", 1),
                          device_class("gpu", f"has(device.attributes['{EXAMPLE}'].model)"),
                          claim_obj("waiting", [request(device_class_name="gpu")]))
    outcome = al.Allocator(state).allocate(state.claims[0], "n1")
    assert outcome.placeable and outcome.devices == ((EXAMPLE, "n1", "gpu-0"),), outcome


def test_allow_multiple_allocations_is_the_devices_own() -> None:
    """Upstream's consumable-capacity classes select on it; one selector (one memo) sees both kinds."""
    selector = ClassSelector(DeviceClassInfo("shared", (f"device.driver == '{EXAMPLE}' && "
                                                        "device.allowMultipleAllocations == true",)))
    assert selector.matches(EXAMPLE, replace(GPU, allow_multiple_allocations=True)) is True
    assert selector.matches(EXAMPLE, GPU) is False
