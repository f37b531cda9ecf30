"""dra-exporter: GPU telemetry for Kubernetes Dynamic Resource Allocation.

Reads NVML, joins it with what the kubelet and the API server say about
ResourceClaims, and publishes metrics labelled by claim, pod, container and
MIG partition.
"""

__version__ = "0.1.0"
