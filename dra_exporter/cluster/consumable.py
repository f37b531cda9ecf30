"""Consumable capacity (``allowMultipleAllocations``): what one request takes of a device that claims
share, rounded by the capacity's ``requestPolicy``. No I/O."""

from __future__ import annotations

from typing import Final

from ..model import CapacityRequestPolicy, DeviceRequestInfo, SliceDevice

#: Slack for sums of base-unit floats.
EPSILON: Final = 1e-9


def consumed_amount(requested: float | None, value: float, policy: CapacityRequestPolicy | None) -> float:
    """What a request takes of one capacity: its amount rounded up by the policy; without an amount
    the policy's default, else the whole capacity."""
    if requested is None:
        return policy.default if policy is not None and policy.default is not None else value
    if policy is None:
        return requested
    if policy.min is not None:
        if requested < policy.min:
            return policy.min
        if not policy.step:
            return requested
        steps = -(-(requested - policy.min) // policy.step)
        return policy.min + policy.step * steps
    if policy.valid_values:
        return next((v for v in policy.valid_values if requested <= v), requested)
    return requested


def _violates(amount: float, policy: CapacityRequestPolicy | None) -> bool:
    if policy is None or (policy.default is not None and amount == policy.default):
        return False
    if policy.min is not None or policy.max is not None or policy.step is not None:
        if policy.max is not None and amount > policy.max:
            return True
        if policy.step and policy.min is not None:
            return abs((amount - policy.min) / policy.step - round((amount - policy.min) / policy.step)) > EPSILON
        return False
    if policy.valid_values:
        return amount not in policy.valid_values
    return False


def share_of(device: SliceDevice, request: DeviceRequestInfo) -> dict[str, float] | None:
    """What ``request`` would take of each of ``device``'s capacities; None when it asks for a
    capacity the device does not have or an amount its policy refuses."""
    capacity = dict(device.capacity)
    asked = dict(request.capacity)
    if any(name not in capacity for name in asked):
        return None
    policies = dict(device.request_policies)
    out = {}
    for name, value in capacity.items():
        amount = consumed_amount(asked.get(name), value, policies.get(name))
        if _violates(amount, policies.get(name)):
            return None
        out[name] = amount
    return out
