# hami-control: the mutating admission webhook and kube-scheduler extender (and `hami-control certs`,
# the TLS bootstrap the certs Job runs).
#
#   docker build -f docker/control.Dockerfile -t REGISTRY/hami-py/hami-control:0.1.0 .
#
# Stages: `build` installs hami-py from this repository into a virtual environment; the last stage is
# the runtime, as an unprivileged user (65532, "nonroot" in distroless terms): the control plane only
# talks HTTPS and to the API server.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

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
LABEL org.opencontainers.image.title="hami-control" \
      org.opencontainers.image.description="hami-py control plane: admission webhook and scheduler extender for shared NVIDIA GPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/hami /opt/hami
ENV PATH=/opt/hami/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["hami-control"]
CMD ["serve"]
