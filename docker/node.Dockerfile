# hami-node: the GPU node daemon (kubelet device plugin, GPU health, node inventory), plus HAMi-core.
#
#   docker build -f docker/node.Dockerfile -t REGISTRY/hami-py/hami-node:0.1.0 .
#
# Stages: `hamicore` takes HAMi-core (libvgpu.so, ld.so.preload, vgpuvalidator) from HAMi's published
# image, unchanged, so containers are limited by the very library HAMi v2.10 ships; `build` installs
# hami-py from this repository into a virtual environment; the last stage is the runtime.
#
# Runs as root: the daemon serves its gRPC socket in, and registers through, kubelet's root-owned
# /var/lib/kubelet/device-plugins (mode 0750), and writes HAMi-core and the per-container cache
# directories under /usr/local/vgpu on the host. The DaemonSet drops every capability and forbids
# privilege escalation, so root here is "owner of those host directories" and nothing more.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG HAMI_IMAGE=projecthami/hami:v2.10.0

FROM ${HAMI_IMAGE} AS hamicore

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY hami_api ./hami_api
COPY hami_node ./hami_node
COPY hami_control ./hami_control
COPY hami_sim ./hami_sim
RUN python -m venv /opt/hami \
 && /opt/hami/bin/pip install --no-cache-dir /src

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="hami-node" \
      org.opencontainers.image.description="hami-py node daemon: kubelet device plugin for shared NVIDIA GPUs, with HAMi-core" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/hami /opt/hami
# HAMi's image keeps HAMi-core here; the init container installs it on the host (hami-core-install).
COPY --from=hamicore /k8s-vgpu/lib/nvidia/ /k8s-vgpu/lib/nvidia/
COPY --chmod=0755 docker/hami_core_install.py /usr/local/bin/hami-core-install
ENV PATH=/opt/hami/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# The interpreter of /usr/local/bin/hami-core-install is the base image's python3 (stdlib only).
# hadolint ignore=DL3002
USER 0:0
ENTRYPOINT ["hami-node"]
