# The SuperLink: the official Flower 1.39 image; /app/state (owned by the image's `app` user) seeds the
# `superlink-state` volume that keeps the database of registered SuperNode keys across restarts.
FROM flwr/superlink:1.39.0
RUN mkdir -p /app/state
