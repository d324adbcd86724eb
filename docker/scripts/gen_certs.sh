#!/usr/bin/env bash
# Certificates for a Bouquet deployment: a CA and the SuperLink's server certificate signed by it.
#
#   docker/scripts/gen_certs.sh OUT_DIR [NAME_OR_IP ...]
#
# The certificate's subjectAltName lists every NAME_OR_IP the SuperLink is dialled by (SuperNodes,
# `flwr` CLI, executors), plus localhost and 127.0.0.1 (its own executor). Use `superlink` for the
# Docker Compose demo and the host name / IP of the SuperLink machine for bare metal. An existing
# CA in OUT_DIR is reused, so a new server certificate stays trusted by distributed ca.crt copies.
# Writes ca.crt (give to every machine), ca.key (keep offline), server.pem + server.key (SuperLink
# only). Nothing here is committed: the output directories are in .gitignore.
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: $0 OUT_DIR [NAME_OR_IP ...]   (e.g. $0 docker/certs superlink)" >&2
    exit 2
fi
out=$1; shift
days=${CERT_DAYS:-365}
mkdir -p "$out"
umask 077

san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
    if [[ $name =~ ^[0-9]+(\.[0-9]+){3}$ || $name == *:* ]]; then
        san+=",IP:$name"
    else
        san+=",DNS:$name"
    fi
done

if [[ ! -f "$out/ca.key" ]]; then
    openssl req -x509 -newkey rsa:4096 -nodes -days "$days" -sha256 \
        -keyout "$out/ca.key" -out "$out/ca.crt" -subj "/CN=Bouquet CA" 2>/dev/null
fi
openssl req -newkey rsa:4096 -nodes -sha256 -keyout "$out/server.key" -out "$out/server.csr" \
    -subj "/CN=${1:-localhost}" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' "$san" \
    > "$out/server.ext"
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -days "$days" -sha256 -extfile "$out/server.ext" -out "$out/server.pem" 2>/dev/null
rm -f "$out/server.csr" "$out/server.ext" "$out/ca.srl"
chmod 644 "$out/ca.crt" "$out/server.pem"
echo "wrote $out/ca.crt $out/server.pem $out/server.key (subjectAltName $san)"
