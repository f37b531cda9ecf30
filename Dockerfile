# syntax=docker/dockerfile:1
# dra-exporter image: `docker build -t dra-exporter:0.1.0 .`
#
# The base is pinned by version tag (Python 3.11.14 on Debian 12 slim). Pin it by digest too
# (python:3.11.14-slim-bookworm@sha256:...) when you build in a place that can look the digest
# up; it could not be resolved where this file was written.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- build: turn the source tree into a wheel --------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dra_exporter ./dra_exporter
COPY dra_exporter_sim ./dra_exporter_sim
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

# --- runtime: the wheel and its dependencies in a venv, nothing else ---------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dra-exporter" \
      org.opencontainers.image.description="GPU metrics for Kubernetes DRA, labelled by claim, pod, container and MIG partition" \
      org.opencontainers.image.licenses="Apache-2.0"
# NVIDIA_*: what the NVIDIA container runtime (docker run --runtime=nvidia, or a RuntimeClass)
# reads to inject the GPUs and the driver's libraries; NVML is in the "utility" ones. A DRA
# claim's CDI spec injects its devices without them.
ENV PATH=/opt/dra-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DRA_EXPORTER_LISTEN=0.0.0.0:9401 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
COPY --from=build /dist /dist
# The wheel carries its dependency ranges (pyproject.toml); pip resolves them here.
RUN python -m venv /opt/dra-exporter \
    && /opt/dra-exporter/bin/pip install --no-cache-dir /dist/*.whl \
    && rm -rf /dist \
    && useradd --system --uid 65532 --no-create-home --shell /usr/sbin/nologin dra-exporter

# Non-root by default. NVML opens /dev/nvidiactl and /dev/nvidia<N>, which the NVIDIA container
# runtime (or a DRA claim's CDI spec) puts in the container world read-writable, so a non-root
# user reads the GPUs. Only the kubelet's pod-resources socket (root-owned, mode 0755) needs
# uid 0: the Helm chart runs the container as root with every capability dropped for that.
USER 65532:65532
EXPOSE 9401

# No curl in a slim image: the exporter asks its own /healthz, reading the same
# DRA_EXPORTER_LISTEN and DRA_EXPORTER_WEB_CONFIG as `serve` (HTTPS when the web-config has TLS).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["dra-exporter", "healthcheck"]

ENTRYPOINT ["dra-exporter"]
CMD ["serve"]
