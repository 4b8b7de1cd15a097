#!/usr/bin/env bash
# A self-signed certificate for the benchmarks' TLS listeners (ECDSA P-256, an end-entity
# certificate for NAME: clients verify it with itself as the CA).
#
#   bash loadtest/self-signed.sh DIR NAME [DAYS]
#
# Writes DIR/cert.pem and DIR/key.pem (DAYS, default 30, of validity); on failure says
# openssl's error and exits 1.
set -euo pipefail
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: bash loadtest/self-signed.sh DIR NAME [DAYS]" >&2
    exit 2
fi
dir=$1 name=$2 days=${3:-30}
command -v openssl >/dev/null || { echo "self-signed.sh needs openssl (apt-get install openssl)" >&2; exit 1; }
if ! err=$(openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$days" \
    -subj "/CN=$name" -addext "subjectAltName=DNS:$name" -addext "basicConstraints=critical,CA:FALSE" \
    -keyout "$dir/key.pem" -out "$dir/cert.pem" 2>&1); then
    echo "self-signed.sh: openssl could not make a certificate for $name in $dir: $err" >&2
    exit 1
fi
