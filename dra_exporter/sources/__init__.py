"""Sources: adapters to the systems the exporter reads (NVML, kubelet, API server, /proc).

The only layer that does I/O on the node's systems. Each source returns frozen
snapshots from ``model`` and knows nothing of Prometheus or OpenTelemetry; tests
point them at the simulated node. Sources never import sinks.
"""


class SourceError(Exception):
    """A source could not produce a snapshot this cycle; the message says why, for operators."""
