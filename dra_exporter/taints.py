"""DeviceTaintRules indexed by what their selectors name, so that applying them costs rules + devices,
not rules x devices. Pure.

A rule's selector names a driver, a pool and a device, each optional (``""``: any). A device
``(driver, pool, device)`` is selected by the rules filed under the key that keeps, of its own three
fields, exactly the ones a rule names: at most eight keys (which fields are named), and only the
shapes some rule has are looked up — in practice one or two (single-device rules name all three, a
driver-wide rule only the driver). Each lookup is a dict access, whatever the number of rules.

Rules that use the 1.33-1.34 selector fields the exporter cannot evaluate (``unsupported_selector``)
select nothing, as ``DeviceTaintRule.selects`` says.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .model import DeviceTaintRule

_Key = tuple[str, str, str]
_Shape = tuple[bool, bool, bool]


class TaintRuleIndex:
    """``matching(driver, pool, device)``: the rules that select that device, in the order given."""

    def __init__(self, rules: Iterable[DeviceTaintRule]) -> None:
        self._filed: dict[_Key, list[tuple[int, DeviceTaintRule]]] = {}
        for order, rule in enumerate(rules):
            if not rule.unsupported_selector:
                self._filed.setdefault((rule.driver, rule.pool, rule.device), []).append((order, rule))
        self._shapes: tuple[_Shape, ...] = tuple(sorted({(bool(d), bool(p), bool(v)) for d, p, v in self._filed}))
        self._by_pool: dict[tuple[str, str], list[tuple[int, DeviceTaintRule]]] = {}
        for (d, p, _), filed in self._filed.items():
            self._by_pool.setdefault((d, p), []).extend(filed)

    def __bool__(self) -> bool:
        return bool(self._filed)

    def for_pool(self, driver: str, pool: str) -> tuple[DeviceTaintRule, ...]:
        """The rules that can select a device of the pool (driver and pool named or left open), in
        the order given: what the allocator applies to the pool's devices."""
        found = [entry for key in {(driver, pool), (driver, ""), ("", pool), ("", "")}
                 for entry in self._by_pool.get(key, ())]
        found.sort(key=lambda entry: entry[0])
        return tuple(rule for _, rule in found)

    def matching(self, driver: str, pool: str, device: str) -> Sequence[DeviceTaintRule]:
        found: list[tuple[int, DeviceTaintRule]] = []
        for by_driver, by_pool, by_device in self._shapes:
            filed = self._filed.get((driver if by_driver else "", pool if by_pool else "",
                                     device if by_device else ""))
            if filed:
                found.extend(filed)
        if not found:
            return ()
        if len(self._shapes) > 1:
            found.sort(key=lambda entry: entry[0])  # several shapes matched: back to the rules' order
        return tuple(rule for _, rule in found)


def devices_per_rule(rules: Sequence[DeviceTaintRule], devices: Iterable[_Key]) -> dict[str, int]:
    """How many of ``devices`` each rule selects, by rule name, in one pass over the devices."""
    index = TaintRuleIndex(rules)
    counts = dict.fromkeys((r.name for r in rules), 0)
    if index:
        for key in devices:
            for rule in index.matching(*key):
                counts[rule.name] += 1
    return counts
