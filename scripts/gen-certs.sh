#!/usr/bin/env bash
# Creates a private CA and, signed by it, a coordinator (server) certificate and a client
# certificate, for Boulder's TLS: development, tests and small clusters.
#
#   scripts/gen-certs.sh DIR [NAME...]
#
# NAMEs are the coordinator's host names and IP addresses the server certificate is valid for
# (default: localhost 127.0.0.1). Writes DIR/ca.pem (give it to clients: --tls-ca), ca.key
# (keep it offline), server.pem + server.key (boulder-coordinator --tls-cert/--tls-key) and
# client.pem + client.key (--tls-cert/--tls-key of the CLI or a worker, for --tls-client-ca).
# Keys are P-256 EC, certificates valid for DAYS days (default 365). Needs the openssl CLI.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [NAME...]" >&2
  exit 2
fi
dir=$1
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(localhost 127.0.0.1)
days=${DAYS:-365}
san=""
for n in "${names[@]}"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
san=${san%,}

mkdir -p "$dir"
cd "$dir"
umask 077
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -days "$days" -subj "/CN=Boulder CA" -out ca.pem \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

sign() {  # sign NAME CN EXTENSIONS
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  printf '%b' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
sign server boulder-coordinator \
  "subjectAltName=$san\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n"
sign client boulder-client "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n"
rm -f ca.srl
chmod 644 ca.pem server.pem client.pem
echo "wrote $dir: ca.pem ca.key server.pem server.key client.pem client.key (server names: $san)"
