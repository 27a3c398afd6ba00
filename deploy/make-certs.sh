#!/usr/bin/env bash
# Makes a private CA and the certificates of a Taskgrid cluster, with openssl.
#
#   deploy/make-certs.sh [--names=NAME|IP,...] [--ca-dir=CADIR] DIR [AGENT...]
#
# DIR gets what the cluster's machines need, and nothing more (keys mode
# 0600, made only where missing, so a second run adds agents without
# replacing anything):
#   ca.pem                    the CA's certificate: every machine and client
#   head.pem, head.key        the scheduler's; its names (SAN) are the ones
#                             clients dial: localhost, 127.0.0.1, ::1, this
#                             machine's `hostname` and `hostname -f`, and
#                             every NAME or IP of --names
#   client.pem, client.key    for taskgridctl, curl, Prometheus (CN client)
#   AGENT.pem, AGENT.key      one per agent; CN and SAN are the agent id, which
#                             the scheduler (with --tls_ca) then requires as its
#                             --id. The units in deploy/ use the host name
#                             (`hostname` on that machine) as the id.
# CADIR (default DIR/ca, mode 0700) gets the CA itself: ca.key, ca.pem,
# ca.srl. It never goes to the cluster: copy DIR's files, not DIR/ca, and
# keep CADIR where only you can read it (or on a machine of its own, passing
# --ca-dir there when you add agents or reissue later).
#
# Run it on the head node, so its own names are in head.pem; elsewhere, give
# the head's names with --names (the names of the machine it runs on are
# then in head.pem too, which admits no one). To reissue a certificate
# (rotation, a name more), remove DIR/NAME.pem and DIR/NAME.key and run it
# again with the same CADIR.
#
# Examples:
#   deploy/make-certs.sh ~/taskgrid-pki "$(hostname)"
#   deploy/make-certs.sh --names=tg.example.com,10.0.0.5 ~/taskgrid-pki worker-1 worker-2
set -euo pipefail

usage() {
  echo "usage: $0 [--names=NAME|IP,...] [--ca-dir=CADIR] DIR [AGENT...]" >&2
  exit 2
}
command -v openssl >/dev/null || { echo "$0: openssl is not installed (apt-get install openssl)" >&2; exit 1; }

extra_names=""
ca_dir=""
while (($# > 0)); do
  case $1 in
    --names=*) extra_names=${1#--names=} ;;
    --ca-dir=*) ca_dir=${1#--ca-dir=} ;;
    --help | -h) usage ;;
    --) shift; break ;;
    -*) echo "$0: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
  shift
done
(($# >= 1)) || usage
dir=$1
shift
ca_dir=${ca_dir:-$dir/ca}
valid_name() { [[ $1 =~ ^[A-Za-z0-9._:-]+$ ]]; }

for agent in "$@"; do
  if [[ $agent == *,* ]]; then
    echo "$0: '$agent': the head's names go in --names=NAME,... (the arguments after DIR are agent ids)" >&2
    exit 2
  fi
  valid_name "$agent" || { echo "$0: bad agent id '$agent'" >&2; exit 2; }
  case $agent in ca | head | client) echo "$0: '$agent' is taken by another file" >&2; exit 2 ;; esac
done
IFS=, read -r -a names <<<"$extra_names"
for n in "${names[@]}"; do
  valid_name "$n" || { echo "$0: bad name '$n' in --names" >&2; exit 2; }
done
days=${TASKGRID_CERT_DAYS:-825}
umask 077
mkdir -p "$dir" "$ca_dir"
chmod 700 "$ca_dir"

# san_of NAME...: "DNS:a,IP:1.2.3.4,..." without repeats.
san_of() {
  local out="" n entry
  declare -A seen=()
  for n in "$@"; do
    [[ -n $n ]] || continue
    if [[ $n =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || $n == *:* ]]; then
      entry="IP:$n"
    else
      entry="DNS:$n"
    fi
    [[ -z ${seen[$entry]:-} ]] || continue
    seen[$entry]=1
    out+="${out:+,}$entry"
  done
  echo "$out"
}

# The CA. A directory made by an earlier version kept ca.key in DIR itself:
# that one is used (so the certificates it issued stay valid), with a note
# to move it.
ca_key=$ca_dir/ca.key
ca_pem=$ca_dir/ca.pem
if [[ ! -f $ca_key && -f $dir/ca.key ]]; then
  ca_key=$dir/ca.key
  ca_pem=$dir/ca.pem
  echo "note: using the CA key $dir/ca.key, beside the cluster's files; move it away:" \
    "mv $dir/ca.key $dir/ca.pem $ca_dir/ (and $dir/ca.srl if there)" >&2
fi
if [[ ! -f $ca_key ]]; then
  if [[ -f $dir/ca.pem ]]; then
    echo "$0: $dir/ca.pem exists but its key is not in $ca_dir: give --ca-dir=THE-CA-DIR" \
      "(or use a new DIR for a new CA)" >&2
    exit 1
  fi
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$ca_key" -out "$ca_pem" -days "$days" -subj "/CN=taskgrid-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    2>/dev/null
  echo "made $ca_pem and its key $ca_key (keep $ca_dir off the cluster)"
fi
if [[ ! -f $dir/ca.pem ]]; then
  cp "$ca_pem" "$dir/ca.pem"
elif ! cmp -s "$ca_pem" "$dir/ca.pem"; then
  echo "$0: $dir/ca.pem is not the CA of $ca_key: give the --ca-dir that made $dir" >&2
  exit 1
fi
ca_serial=${ca_pem%.pem}.srl

# issue NAME USAGE SAN: NAME.pem/NAME.key signed by the CA.
issue() {
  local name=$1 usage=$2 san=$3 ext
  if [[ -f $dir/$name.pem ]]; then
    echo "kept $dir/$name.pem (to reissue it: rm $dir/$name.pem $dir/$name.key, run again)"
    return
  fi
  ext=$(mktemp)
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\nsubjectAltName=%s\n' \
    "$usage" "$san" >"$ext"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$dir/$name.key" \
    -out "$dir/$name.csr" -subj "/CN=$name" 2>/dev/null
  openssl x509 -req -in "$dir/$name.csr" -CA "$ca_pem" -CAkey "$ca_key" \
    -CAserial "$ca_serial" -CAcreateserial -days "$days" -extfile "$ext" -out "$dir/$name.pem" 2>/dev/null
  rm -f "$dir/$name.csr" "$ext"
  chmod 600 "$dir/$name.key"
  chmod 644 "$dir/$name.pem"
  echo "made $dir/$name.pem ($san)"
}

host_short=$(hostname 2>/dev/null || true)
host_full=$(hostname -f 2>/dev/null || true)
issue head serverAuth "$(san_of localhost 127.0.0.1 ::1 "$host_short" "$host_full" "${names[@]}")"
issue client clientAuth "DNS:client"
for agent in "$@"; do
  issue "$agent" clientAuth "DNS:$agent"
done
chmod 644 "$dir/ca.pem" "$ca_pem"
