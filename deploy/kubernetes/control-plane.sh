#!/usr/bin/env bash
# A real Kubernetes control plane on 127.0.0.1, offline: etcd (Debian's etcd-server),
# kube-apiserver, kube-controller-manager and kube-scheduler v1.37.2 built from the Go module
# proxy, and kwok for a fake node (pods are scheduled and reported Ready, containers do not run).
#
#   deploy/kubernetes/control-plane.sh build          # build or reuse the binaries (~15 min cold)
#   deploy/kubernetes/control-plane.sh up DIR         # start everything; writes DIR/kubeconfig
#   deploy/kubernetes/control-plane.sh down DIR       # stop what `up DIR` started
#
# Binaries are cached in ${TERN_TOOLS:-~/.cache/tern-tools}/kubernetes-v1.37.2. Used by
# deploy/kubernetes/check.sh, which applies Tern's manifests to it.
set -euo pipefail

K8S=v1.37.2
STAGING=v0.37.2
KWOK=v0.8.0
TOOLS="${TERN_TOOLS:-$HOME/.cache/tern-tools}"
BIN="$TOOLS/kubernetes-$K8S"

log() { printf '[control-plane] %s\n' "$*" >&2; }

# Kubernetes' own go.mod replaces its staging modules (k8s.io/api, client-go, ...) with local
# paths, so `go install k8s.io/kubernetes/cmd/...` cannot work. A small wrapper module requires
# k8s.io/kubernetes and points every staging module at its published release instead.
build() {
    if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] &&
        [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/kwok" ]; then
        log "binaries cached in $BIN"
        return
    fi
    command -v go >/dev/null || { log "needs Go 1.26 or newer"; exit 1; }
    mkdir -p "$BIN"
    local mod="$BIN/wrapper"
    rm -rf "$mod" && mkdir -p "$mod"
    (
        cd "$mod"
        go mod init tern.local/k8sbuild >/dev/null 2>&1
        for m in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go \
            cloud-provider cluster-bootstrap code-generator component-base component-helpers \
            controller-manager cri-api cri-client cri-streaming csi-translation-lib \
            dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator \
            kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics \
            mount-utils pod-security-admission sample-apiserver sample-cli-plugin \
            sample-controller streaming; do
            go mod edit -replace "k8s.io/$m=k8s.io/$m@$STAGING"
        done
        log "resolving k8s.io/kubernetes@$K8S"
        go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S"
        for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
            [ -x "$BIN/$cmd" ] && continue
            log "building $cmd"
            # The version the binaries report (Kubernetes' own build sets it the same way).
            go build -mod=mod -ldflags "-X k8s.io/component-base/version.gitVersion=$K8S \
                -X k8s.io/component-base/version.gitMajor=1 \
                -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$K8S")" \
                -o "$BIN/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
            mv "$BIN/$cmd.tmp" "$BIN/$cmd"
        done
    )
    if [ ! -x "$BIN/kwok" ]; then
        log "building kwok $KWOK"
        GOBIN="$BIN" go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK"
    fi
    log "built into $BIN"
}

ensure_etcd() {
    command -v etcd >/dev/null && return
    log "installing etcd-server (Debian)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
    # Debian starts the packaged service; this script runs its own.
    (systemctl stop etcd || service etcd stop) >/dev/null 2>&1 || true
}

wait_for() { # what, seconds, command...
    local what=$1 secs=$2
    shift 2
    for _ in $(seq "$((secs * 5))"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    log "$what did not come up in ${secs}s"
    return 1
}

up() {
    local dir=$1
    build
    ensure_etcd
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    local etcd_port etcd_peer api_port
    etcd_port=$(free_port) etcd_peer=$(free_port) api_port=$(free_port)
    local token
    token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
    openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
    echo "$token,admin,admin,system:masters" >"$dir/tokens.csv"

    etcd --name tern-check --data-dir "$dir/etcd" \
        --listen-client-urls "http://127.0.0.1:$etcd_port" \
        --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
        --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
        --initial-cluster "tern-check=http://127.0.0.1:$etcd_peer" \
        >"$dir/etcd.log" 2>&1 &
    echo $! >"$dir/etcd.pid"

    "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
        --bind-address 127.0.0.1 --secure-port "$api_port" \
        --cert-dir "$dir/pki" --service-account-issuer https://kubernetes.default.svc \
        --service-account-key-file "$dir/sa.pub" \
        --service-account-signing-key-file "$dir/sa.key" \
        --token-auth-file "$dir/tokens.csv" --authorization-mode RBAC \
        --service-cluster-ip-range 10.96.0.0/16 >"$dir/apiserver.log" 2>&1 &
    echo $! >"$dir/apiserver.pid"

    cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: local
    cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}
users:
  - name: admin
    user: {token: "$token"}
contexts:
  - name: local
    context: {cluster: local, user: admin, namespace: default}
current-context: local
EOF
    export KUBECONFIG="$dir/kubeconfig"
    wait_for "kube-apiserver" 180 kubectl get --raw /readyz

    "$BIN/kube-controller-manager" --kubeconfig "$dir/kubeconfig" --leader-elect=false \
        --bind-address 127.0.0.1 --secure-port 0 \
        --service-account-private-key-file "$dir/sa.key" \
        --root-ca-file "$dir/pki/apiserver.crt" --use-service-account-credentials \
        --controllers '*,-nodeipam' >"$dir/controller-manager.log" 2>&1 &
    echo $! >"$dir/controller-manager.pid"
    "$BIN/kube-scheduler" --kubeconfig "$dir/kubeconfig" --leader-elect=false \
        --bind-address 127.0.0.1 --secure-port 0 >"$dir/scheduler.log" 2>&1 &
    echo $! >"$dir/scheduler.pid"

    local stages
    stages="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK/kustomize/stage"
    "$BIN/kwok" --kubeconfig "$dir/kubeconfig" --manage-all-nodes=false \
        --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
        --cidr 10.0.0.1/24 --node-ip 10.0.0.1 --server-address 127.0.0.1:0 \
        --node-lease-duration-seconds 40 \
        -c "$stages/node/fast/node-initialize.yaml" \
        -c "$stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
        -c "$stages/pod/fast/pod-ready.yaml" \
        -c "$stages/pod/fast/pod-complete.yaml" -c "$stages/pod/fast/pod-delete.yaml" \
        >"$dir/kwok.log" 2>&1 &
    echo $! >"$dir/kwok.pid"

    kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: fake-node
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/os: linux, kubernetes.io/arch: amd64, type: kwok}
status:
  allocatable: {cpu: "32", memory: 64Gi, pods: "110"}
  capacity: {cpu: "32", memory: 64Gi, pods: "110"}
EOF
    wait_for "the fake node" 60 sh -c \
        "kubectl get node fake-node -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
    wait_for "the default service account" 60 kubectl get serviceaccount default
    log "control plane up; export KUBECONFIG=$dir/kubeconfig"
}

down() {
    local dir=$1 pid
    for p in kwok scheduler controller-manager apiserver etcd; do
        [ -f "$dir/$p.pid" ] || continue
        pid=$(cat "$dir/$p.pid")
        kill "$pid" 2>/dev/null || true
        # Gone before the next `up` binds its ports.
        for _ in $(seq 75); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$dir/$p.pid"
    done
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case "${1:-}" in
build) build ;;
up) up "${2:?usage: $0 up DIR}" ;;
down) down "${2:?usage: $0 down DIR}" ;;
*)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
