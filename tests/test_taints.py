"""The DeviceTaintRule index selects exactly what ``DeviceTaintRule.selects`` does, in the rules'
order, at a cost that does not grow with the number of rules (``benchmarks/bench_taints.py``)."""

from __future__ import annotations

import itertools
import random

from dra_exporter.model import DeviceTaint, DeviceTaintRule
from dra_exporter.taints import TaintRuleIndex, devices_per_rule

DRIVERS, POOLS, DEVICES = ("gpu.nvidia.com", "other"), ("n1", "n2", ""), ("gpu-0", "gpu-1", "")


def rule(name: str, driver: str = "", pool: str = "", device: str = "", unsupported: bool = False) -> DeviceTaintRule:
    return DeviceTaintRule(name, DeviceTaint("k", "v", "NoSchedule"), driver, pool, device, unsupported)


def test_every_selector_shape_selects_what_selects_says_in_the_rules_order() -> None:
    rng = random.Random(7)
    shapes = list(itertools.product(DRIVERS + ("",), POOLS, DEVICES))
    rules = [rule(f"r{i}", *rng.choice(shapes), unsupported=rng.random() < 0.1) for i in range(60)]
    index = TaintRuleIndex(rules)
    for driver, pool, device in itertools.product(DRIVERS, ("n1", "n2", "n3"), ("gpu-0", "gpu-1", "gpu-2")):
        assert list(index.matching(driver, pool, device)) == [r for r in rules if r.selects(driver, pool, device)]


def test_no_rules_match_nothing_and_unsupported_selectors_select_nothing() -> None:
    assert not TaintRuleIndex([]) and TaintRuleIndex([]).matching("d", "p", "x") == ()
    assert TaintRuleIndex([rule("any", unsupported=True)]).matching("d", "p", "x") == ()
    assert [r.name for r in TaintRuleIndex([rule("any")]).matching("d", "p", "x")] == ["any"]


def test_devices_per_rule_counts_each_rule_once_per_device() -> None:
    rules = [rule("driver", "gpu.nvidia.com"), rule("one", "gpu.nvidia.com", "n1", "gpu-0"), rule("none", "x")]
    devices = [("gpu.nvidia.com", "n1", "gpu-0"), ("gpu.nvidia.com", "n1", "gpu-1"), ("other", "n1", "gpu-0")]
    assert devices_per_rule(rules, devices) == {"driver": 2, "one": 1, "none": 0}


def test_the_rules_for_a_pool_are_those_that_can_select_one_of_its_devices_in_order() -> None:
    rng = random.Random(11)
    shapes = list(itertools.product(DRIVERS + ("",), POOLS, DEVICES))
    rules = [rule(f"r{i}", *rng.choice(shapes), unsupported=rng.random() < 0.1) for i in range(60)]
    index = TaintRuleIndex(rules)
    for driver, pool in itertools.product(DRIVERS, ("n1", "n2", "n3")):
        assert list(index.for_pool(driver, pool)) == [
            r for r in rules if not r.unsupported_selector and r.driver in ("", driver) and r.pool in ("", pool)]
