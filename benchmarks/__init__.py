"""dra-exporter benchmarks: ``python3 -m benchmarks.run`` (see docs/performance.md)."""
