# Local stand-ins for the official Flower 1.39 images (flwr/superlink, flwr/supernode, flwr/superexec)
# on machines that cannot pull them: Debian bookworm's Python 3.11, Flower in the virtual environment
# /python/venv, the non-root user `app` (uid 49999, home and working directory /app) and the same
# entrypoints and environment as Flower's images. Built by `docker/scripts/build_images.sh --local-bases`:
#   docker build --target superlink -t bouquet-base/superlink:1.39.0 -f docker/base.Dockerfile docker
# DEBIAN is a Debian image with python3, python3-venv and ca-certificates (`build_images.sh --local-bases` imports one
# made by debootstrap); PIP_OPTIONS are extra `pip install` options (e.g. a local wheelhouse).
ARG DEBIAN=debian:bookworm-slim
FROM ${DEBIAN} AS base
ARG FLWR_VERSION=1.39.0
ARG PIP_OPTIONS=""
RUN useradd --no-create-home --home-dir /app --uid 49999 --user-group --shell /bin/bash app \
    && mkdir -p /app && chown app:app /app \
    && python3 -m venv /python/venv \
    && /python/venv/bin/pip install --no-cache-dir --disable-pip-version-check ${PIP_OPTIONS} \
        "flwr==${FLWR_VERSION}" \
    && chown -R app:app /python/venv \
    && rm -rf /root/.cache
ENV PATH=/python/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONIOENCODING=UTF-8 \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8
WORKDIR /app
USER app
ENV HOME=/app

FROM base AS superlink
ENTRYPOINT ["flower-superlink"]

FROM base AS supernode
ENTRYPOINT ["flower-supernode"]

FROM base AS superexec
ENTRYPOINT ["flower-superexec"]
