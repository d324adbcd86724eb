#!/usr/bin/env bash
# Register SuperNode public keys with a SuperLink (it must run with --enable-supernode-auth).
#
#   docker/scripts/register_keys.sh CONNECTION KEY_DIR
#
# CONNECTION names a `[superlink.<name>]` entry of $FLWR_HOME/config.toml (address host:8000 and
# root-certificates = the CA). Registers every KEY_DIR/supernode-<i>.pub as `site-<i>`; prints the
# node ids. A key that is already registered is reported and skipped.
set -euo pipefail
if [[ $# -ne 2 ]]; then
    echo "usage: $0 CONNECTION KEY_DIR   (e.g. $0 bouquet-docker docker/keys)" >&2
    exit 2
fi
connection=$1; dir=$2
shopt -s nullglob
keys=("$dir"/supernode-*.pub)
if [[ ${#keys[@]} -eq 0 ]]; then
    echo "no $dir/supernode-*.pub: run docker/scripts/gen_keys.sh $dir N first" >&2
    exit 1
fi
for pub in "${keys[@]}"; do
    name=$(basename "$pub" .pub)
    flwr supernode register "$pub" "$connection" --name "site-${name#supernode-}"
done
