# syntax=docker/dockerfile:1.7
# The joblease operator image (also usable for workers: it holds the SDK and the CLI).
#
# Built in the tests with BuildKit (joblease_localcluster.buildkit, FROM a local mmdebstrap
# base) and elsewhere with Docker:
#   docker build -t localhost/joblease-operator:dev .
#
# Pinned base: an exact Python patch release on an exact Debian release. For fully
# repeatable builds also pin the digest your registry shows for it, e.g.
#   --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest>
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Only what the package needs: metadata (README and LICENSE are part of it), the pins, and
# the product's source, operator/ (never localcluster/: tests/packaging checks the COPY and
# pip lines). constraints.txt pins every transitive dependency, the same pins the tests ran
# with.
COPY pyproject.toml constraints.txt README.md LICENSE ./
# The dependencies first, installed through a stand-in package (only `__version__`, which pyproject.toml reads), so that a change to
# the source reuses this layer (the slow part) and rebuilds only the next one.
# setuptools/wheel pinned for the build itself; no build isolation so no unpinned fetch.
RUN mkdir -p operator/joblease \
 && echo '__version__ = "0"  # placeholder: the real package is installed below' \
      > operator/joblease/__init__.py \
 && python -m venv /opt/joblease \
 && /opt/joblease/bin/pip install setuptools==80.9.0 wheel==0.45.1 \
 && /opt/joblease/bin/pip install --no-build-isolation -c constraints.txt '.[postgres]'
COPY operator/ ./operator/
RUN /opt/joblease/bin/pip install --no-build-isolation --no-deps --force-reinstall \
      -c constraints.txt . \
 && /opt/joblease/bin/pip uninstall -y setuptools wheel pip

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="joblease-operator" \
      org.opencontainers.image.description="JobLease operator and worker SDK" \
      org.opencontainers.image.licenses="Apache-2.0"
# Read-only root filesystem in the chart: no bytecode writes, unbuffered logs.
ENV PATH=/opt/joblease/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /opt/joblease /opt/joblease
# A passwd/group entry for 65532: kopf names its identity with getpass.getuser(), which
# raises KeyError for a uid that /etc/passwd does not know (found on the real node: the
# operator pod crash-looped with "getpwuid(): uid not found: 65532").
RUN echo 'joblease:x:65532:65532:joblease:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'joblease:x:65532:' >> /etc/group
# 65532: the conventional "nonroot" uid/gid; the chart's securityContext expects it.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["python", "-m", "joblease"]
CMD ["--metrics-addr=0.0.0.0", "--health-addr=0.0.0.0:8081"]
