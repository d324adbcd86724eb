#!/usr/bin/env bash
# SuperNode authentication keys: one ECDSA P-384 key pair per SuperNode.
#
#   docker/scripts/gen_keys.sh OUT_DIR N        -> OUT_DIR/supernode-<i> (+ .pub), i = 0..N-1
#
# Each private key stays on its SuperNode's machine (`--auth-supernode-private-key`); the public key
# is registered with the SuperLink by its operator: `flwr supernode register OUT_DIR/supernode-<i>.pub
# <connection> --name site-<i>` (docker/scripts/register_keys.sh does all of them). Existing keys are
# kept (a node's identity follows its key). Nothing here is committed (.gitignore).
set -euo pipefail
if [[ $# -ne 2 ]]; then
    echo "usage: $0 OUT_DIR NUM_SUPERNODES   (e.g. $0 docker/keys 3)" >&2
    exit 2
fi
out=$1; n=$2
mkdir -p "$out"
for ((i = 0; i < n; i++)); do
    if [[ ! -f "$out/supernode-$i" ]]; then
        ssh-keygen -q -t ecdsa -b 384 -N "" -C "bouquet-supernode-$i" -f "$out/supernode-$i"
    fi
done
echo "keys in $out: $(cd "$out" && ls supernode-* | tr '\n' ' ')"
