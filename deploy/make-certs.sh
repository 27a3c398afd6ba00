#!/usr/bin/env bash
# Makes a private CA and the certificates of a Taskgrid cluster, with openssl.
#
#   deploy/make-certs.sh DIR HEAD[,NAME|IP...] [AGENT...]
#
# DIR gets (keys mode 0600, made only where missing, so a second run adds
# agents without replacing anything):
#   ca.pem, ca.key            the CA: keep ca.key off the cluster's machines
#   head.pem, head.key        the scheduler; its names (SAN): HEAD and every
#                             NAME or IP after it, plus localhost and 127.0.0.1
#   client.pem, client.key    for taskgridctl and other clients (CN client)
#   AGENT.pem, AGENT.key      one per agent; CN and SAN are the agent id, which
#                             the scheduler (with --tls_ca) then requires as its --id
# Example:
#   deploy/make-certs.sh /etc/taskgrid/tls head.example,10.0.0.5 worker-1 worker-2
set -euo pipefail

usage() {
  echo "usage: $0 DIR HEAD[,NAME|IP...] [AGENT...]" >&2
  exit 2
}
(($# >= 2)) || usage
command -v openssl >/dev/null || { echo "$0: openssl is not installed (apt-get install openssl)" >&2; exit 1; }

dir=$1
head_names=$2
shift 2
days=${TASKGRID_CERT_DAYS:-825}
mkdir -p "$dir"
umask 077

valid_name() { [[ $1 =~ ^[A-Za-z0-9._:-]+$ ]]; }

# san_of NAME...: "DNS:a,IP:1.2.3.4,..."
san_of() {
  local out="" n
  for n in "$@"; do
    if [[ $n =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || $n == *:* ]]; then
      out+="${out:+,}IP:$n"
    else
      out+="${out:+,}DNS:$n"
    fi
  done
  echo "$out"
}

if [[ ! -f $dir/ca.pem ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" -days "$days" -subj "/CN=taskgrid-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
  echo "made $dir/ca.pem"
fi

# issue NAME USAGE SAN: NAME.pem/NAME.key signed by the CA.
issue() {
  local name=$1 usage=$2 san=$3 ext
  if [[ -f $dir/$name.pem ]]; then
    echo "kept $dir/$name.pem"
    return
  fi
  ext=$(mktemp)
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\nsubjectAltName=%s\n' \
    "$usage" "$san" >"$ext"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$dir/$name.key" \
    -out "$dir/$name.csr" -subj "/CN=$name" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
    -days "$days" -extfile "$ext" -out "$dir/$name.pem" 2>/dev/null
  rm -f "$dir/$name.csr" "$ext"
  chmod 600 "$dir/$name.key"
  echo "made $dir/$name.pem ($san)"
}

IFS=, read -r -a names <<<"$head_names"
for n in "${names[@]}"; do
  valid_name "$n" || { echo "$0: bad head name '$n'" >&2; exit 2; }
done
issue head serverAuth "$(san_of "${names[@]}" localhost 127.0.0.1)"
issue client clientAuth "DNS:client"
for agent in "$@"; do
  valid_name "$agent" || { echo "$0: bad agent id '$agent'" >&2; exit 2; }
  case $agent in ca | head | client) echo "$0: '$agent' is taken by another file" >&2; exit 2 ;; esac
  issue "$agent" clientAuth "DNS:$agent"
done
chmod 600 "$dir"/*.key
chmod 644 "$dir"/*.pem
