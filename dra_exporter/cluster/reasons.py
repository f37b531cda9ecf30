"""Why a candidate device (one that meets the class's and the request's selectors) was not used, in
the order the scheduler's allocator checks; shared by the allocator, ``explain`` and the pending-reason
family. Constants only."""

from __future__ import annotations

from typing import Final

POOL_INCOMPLETE: Final = "pool_incomplete"
POOL_INVALID: Final = "pool_invalid"
TAKEN: Final = "taken"
SELECTOR_ERROR: Final = "selector_not_evaluable"
#: The scheduler runs the class's or the request's CEL, this exporter cannot: no verdict either way.
UNSUPPORTED_SELECTOR: Final = "selector_not_supported"
NODE: Final = "node_constraint"
CAPACITY: Final = "capacity_exhausted"
COUNTERS: Final = "counters_exhausted"
TAINTED: Final = "tainted"
CONSTRAINT: Final = "attribute_constraint"
CLASS_MISSING: Final = "class_missing"
REASONS: Final = (CLASS_MISSING, UNSUPPORTED_SELECTOR, SELECTOR_ERROR, POOL_INCOMPLETE, POOL_INVALID, TAKEN, NODE,
                  CAPACITY, COUNTERS, TAINTED, CONSTRAINT)
#: A claim that fits alone, but not on one node together with the other pending claims of its pod.
TOGETHER: Final = "pod_claims_together"
#: The pod's node selector, required node affinity or tolerations keep it off every node with matching devices.
NODE_FILTERED: Final = "node_filters"
