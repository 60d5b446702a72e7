#!/usr/bin/env bash
# Makes the injector's serving certificate with openssl, without cert-manager:
#   - a CA (ca.key, ca.crt; kept and reused on later runs, so the webhook's
#     caBundle does not change when the serving certificate is renewed);
#   - a serving certificate for charon-injector.charon-system.svc (SAN),
#     signed by that CA (tls.key as PKCS#8 PEM, tls.crt);
#   - secret.yaml: the Secret charon-injector-tls (kubernetes.io/tls);
#   - kustomization.yaml: the injector (../base), the Secret, and the CA as
#     the webhook's caBundle; cabundle-patch.json: that caBundle as a JSON
#     patch, for `kubectl patch` on an injector applied without it;
# all in OUT (default: deploy/kubernetes/injector/certs, ignored by git).
# Prints the caBundle (base64 of ca.crt) on stdout, logs on stderr.
#
# Usage: gen-certs.sh [--out DIR] [--new-ca] [--apply]
#   --apply   then `kubectl apply -k OUT` (kubectl from $KUBECTL, else PATH)
#   --new-ca  make a new CA even if OUT has one
# Environment: NAMESPACE (charon-system), SERVICE (charon-injector),
#   DAYS (serving certificate, 365), CA_DAYS (3650).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$HERE/certs"
APPLY=""
NEW_CA=""
NAMESPACE="${NAMESPACE:-charon-system}"
SERVICE="${SERVICE:-charon-injector}"
DAYS="${DAYS:-365}"
CA_DAYS="${CA_DAYS:-3650}"
KUBECTL="${KUBECTL:-kubectl}"

log() { echo "gen-certs: $*" >&2; }
usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift 2 ;;
        --out=*) OUT="${1#--out=}"; shift ;;
        --apply) APPLY=1; shift ;;
        --new-ca) NEW_CA=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) log "unknown argument: $1"; usage; exit 2 ;;
    esac
done

command -v openssl >/dev/null 2>&1 || { log "openssl is needed"; exit 1; }
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
umask 077

HOST="$SERVICE.$NAMESPACE.svc"
b64() { openssl base64 -A <"$1"; }

# --- the CA --------------------------------------------------------------
if [ -z "$NEW_CA" ] && [ -s "$OUT/ca.key" ] && [ -s "$OUT/ca.crt" ] \
    && openssl x509 -in "$OUT/ca.crt" -noout -checkend $((30 * 86400)) >/dev/null; then
    log "reusing the CA in $OUT/ca.crt"
else
    log "making a CA in $OUT/ca.crt"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$OUT/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$OUT/ca.key" -sha256 -days "$CA_DAYS" \
        -subj "/CN=charon-injector-ca" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$OUT/ca.crt"
fi

# --- the serving certificate ----------------------------------------------
log "making a serving certificate for $HOST in $OUT/tls.crt"
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$OUT/tls.key" 2>/dev/null
cat >"$OUT/tls.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:$HOST,DNS:$HOST.cluster.local,DNS:$SERVICE.$NAMESPACE,DNS:$SERVICE
EOF
openssl req -new -key "$OUT/tls.key" -subj "/CN=$HOST" -out "$OUT/tls.csr"
openssl x509 -req -in "$OUT/tls.csr" -CA "$OUT/ca.crt" -CAkey "$OUT/ca.key" \
    -CAcreateserial -sha256 -days "$DAYS" -extfile "$OUT/tls.ext" -out "$OUT/tls.crt" 2>/dev/null
rm -f "$OUT/tls.csr" "$OUT/tls.ext" "$OUT/ca.srl"
openssl verify -CAfile "$OUT/ca.crt" "$OUT/tls.crt" >/dev/null

CA_BUNDLE="$(b64 "$OUT/ca.crt")"

# --- the Secret and the kustomization -------------------------------------
cat >"$OUT/secret.yaml" <<EOF
# Written by gen-certs.sh. Holds a private key: keep it out of git.
apiVersion: v1
kind: Secret
metadata:
  name: $SERVICE-tls
  namespace: $NAMESPACE
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$OUT/tls.crt")
  tls.key: $(b64 "$OUT/tls.key")
  ca.crt: $CA_BUNDLE
EOF

BASE="$(realpath --relative-to="$OUT" "$HERE/base" 2>/dev/null || echo "$HERE/base")"
cat >"$OUT/kustomization.yaml" <<EOF
# Written by gen-certs.sh: the injector with its openssl certificate.
#   kubectl apply -k $OUT
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization

resources:
  - $BASE
  - secret.yaml

patches:
  - target:
      kind: MutatingWebhookConfiguration
      name: charon-injector
    patch: |-
      - op: add
        path: /webhooks/0/clientConfig/caBundle
        value: $CA_BUNDLE
EOF
printf '[{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "%s"}]\n' \
    "$CA_BUNDLE" >"$OUT/cabundle-patch.json"
chmod 644 "$OUT/ca.crt" "$OUT/tls.crt" "$OUT/kustomization.yaml" "$OUT/cabundle-patch.json"

log "wrote $OUT/{ca.crt,ca.key,tls.crt,tls.key,secret.yaml,kustomization.yaml,cabundle-patch.json}"
if [ -n "$APPLY" ]; then
    log "$KUBECTL apply -k $OUT"
    "$KUBECTL" apply -k "$OUT" >&2
else
    log "next: kubectl apply -k $OUT"
    log "(or, with the injector already applied: kubectl apply -f $OUT/secret.yaml"
    log " && kubectl patch mutatingwebhookconfiguration charon-injector --type=json --patch-file $OUT/cabundle-patch.json)"
fi
# The caBundle, on stdout.
echo "$CA_BUNDLE"
