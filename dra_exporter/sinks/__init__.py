"""Sinks: publish frames (Prometheus scrape endpoint, OTLP push).

Sinks read ``Frame`` records and the metric catalogue only; they never import sources.
"""
