#!/usr/bin/env bash
# Build the demo's images: bouquet-superlink and bouquet-superexec (docker/compose.yml's `build:`).
#
#   docker/scripts/build_images.sh [--local-bases]
#
# BOUQUET_TORCH (as for docker/compose.yml): `cpu` (default) builds bouquet-superexec:<version>-cpu,
# a CPU-only torch and no torchvision nor CUDA packages; `cuda` builds bouquet-superexec:<version>-cuda,
# PyPI's torch with its CUDA packages and torchvision (for GPU clients).
# --local-bases  first build the Flower 1.39 base images locally (bouquet-base/superlink,
#                bouquet-base/supernode, bouquet-base/superexec from docker/base.Dockerfile) on a
#                Debian bookworm root made by debootstrap (image bouquet-debian:bookworm, made once
#                and reused), for machines that cannot pull flwr/* from Docker Hub. Then use
#                FLWR_IMAGES=bouquet-base with docker compose (this script exports it for its build).
# If $BOUQUET_WHEELS (default docker/wheels/) holds wheels (docker/scripts/fetch_wheels.sh), every
# `pip install` of the build takes them from there (served on 127.0.0.1:$BOUQUET_WHEELS_PORT, default
# 47123, for the build, with --network host) and nothing from an index; otherwise pip uses its index
# as usual. Needs root (debootstrap) for --local-bases.
# COMPOSE overrides the Compose command (default: `docker compose` if present, else `docker-compose`).
set -euo pipefail
cd "$(dirname "$0")/../.."
flwr_version=$(sed -n 's/^FLOWER_VERSION = "\([^"]*\)".*/\1/p' server_app/harness/deploy.py)
local_bases=0
for arg in "$@"; do
    case $arg in
        --local-bases) local_bases=1 ;;
        *) echo "usage: $0 [--local-bases]" >&2; exit 2 ;;
    esac
done
if [[ -z ${COMPOSE:-} ]]; then
    if docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"; else COMPOSE=docker-compose; fi
fi

wheels=${BOUQUET_WHEELS:-docker/wheels}
pip_options=""
network=default
if compgen -G "$wheels/*.whl" >/dev/null; then
    # A fixed port: the pip options are build arguments, and a changed argument defeats the cache.
    port=${BOUQUET_WHEELS_PORT:-47123}
    if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null; then
        echo "127.0.0.1:$port is in use: set BOUQUET_WHEELS_PORT to a free port" >&2
        exit 1
    fi
    python3 -m http.server --bind 127.0.0.1 --directory "$wheels" "$port" >/dev/null 2>&1 &
    server=$!
    trap 'kill "$server" 2>/dev/null || true' EXIT
    for _ in $(seq 50); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && break
        sleep 0.1
    done
    pip_options="--no-index --find-links http://127.0.0.1:$port/"
    network=host
    # the CPU torch (docker/scripts/fetch_wheels.sh keeps it apart, in torch-cpu/)
    if compgen -G "$wheels/torch-cpu/torch-*+cpu-*.whl" >/dev/null; then
        export BOUQUET_TORCH_CPU_OPTIONS="--no-index --find-links http://127.0.0.1:$port/torch-cpu/"
    fi
    echo "pip installs from $wheels ($(ls "$wheels"/*.whl | wc -l) wheels)"
fi

if [[ $local_bases == 1 ]]; then
    debian=bouquet-debian:bookworm
    if ! docker image inspect "$debian" >/dev/null 2>&1; then
        root=$(mktemp -d)
        echo "debootstrap bookworm -> $debian"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
            "$root" >/dev/null
        # package caches and lists, documentation: not needed at run time (~140 MB)
        rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
            "$root"/usr/share/man/* "$root"/usr/share/locale/*
        tar -C "$root" -c . | docker import - "$debian" >/dev/null
        rm -rf "$root"
    fi
    for role in superlink supernode superexec; do
        docker build --quiet --network "$network" --target "$role" --build-arg DEBIAN="$debian" \
            --build-arg FLWR_VERSION="$flwr_version" --build-arg PIP_OPTIONS="$pip_options" \
            -t "bouquet-base/$role:$flwr_version" -f docker/base.Dockerfile docker/scripts >/dev/null
        echo "built bouquet-base/$role:$flwr_version"
    done
    export FLWR_IMAGES=bouquet-base
fi

export BOUQUET_PIP_OPTIONS=$pip_options BOUQUET_BUILD_NETWORK=$network
echo "bouquet-superexec: ${BOUQUET_TORCH:-cpu} torch"
$COMPOSE -p bouquet -f docker/compose.yml build superlink superexec-serverapp
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^bouquet-(base/|superlink|superexec)' || true
