# The SuperLink: the Flower 1.39 SuperLink image (BASE: the official one by default, or a local
# stand-in from `docker/scripts/build_images.sh --local-bases`); /app/state (owned by the image's `app` user) seeds the
# `superlink-state` volume that keeps the database of registered SuperNode keys across restarts.
ARG BASE=flwr/superlink:1.39.0
FROM ${BASE}
RUN mkdir -p /app/state
