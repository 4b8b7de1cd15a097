#!/usr/bin/env bash
# Applies Tern's Kubernetes manifests (the single-node tern.yaml and the fleet variant) to a real
# control plane on 127.0.0.1 (control-plane.sh: etcd, kube-apiserver, controller-manager,
# scheduler v1.37, kwok's fake node) and checks what Kubernetes does with them: server-side
# validation, rollouts to Ready, the Services' endpoints, a new image tag rolled one pod at a time
# within the PodDisruptionBudget, scaling, the HorizontalPodAutoscalers' targets.
#
#   deploy/kubernetes/check.sh            # ~3 min with cached binaries, ~15 min more cold
#
# kwok reports pods Ready without running their containers, so this checks the manifests and
# their orchestration, not Tern inside them (the e2e suite runs real replicas on one registry).
# Not part of `.ci/run`: the cold build of the control plane takes longer than CI should.
set -euo pipefail
cd "$(dirname "$0")/../.."

DIR=$(mktemp -d /tmp/tern-k8s-check.XXXXXX)
PLANE=deploy/kubernetes/control-plane.sh
trap '"$PLANE" down "$DIR"; [ "${KEEP:-}" ] || rm -rf "$DIR"' EXIT
"$PLANE" up "$DIR"
export KUBECONFIG="$DIR/kubeconfig"

ok() { printf 'ok   %s\n' "$*"; }
fail() {
    printf 'FAIL %s\n' "$*" >&2
    kubectl get all,pdb,endpointslices -o wide >&2 || true
    exit 1
}
# ready_endpoints SERVICE: the number of ready addresses in the Service's EndpointSlices.
ready_endpoints() {
    kubectl get endpointslices -l "kubernetes.io/service-name=$1" \
        -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{"\n"}{end}' |
        grep -c . || true
}
wait_endpoints() { # SERVICE COUNT
    for _ in $(seq 150); do
        [ "$(ready_endpoints "$1")" = "$2" ] && return 0
        sleep 0.2
    done
    fail "service $1: $(ready_endpoints "$1") ready endpoints, expected $2"
}

# The Secrets the manifests expect.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj /CN=tern.test -keyout "$DIR/tls.key" -out "$DIR/tls.crt" 2>/dev/null
kubectl create secret tls tern-tls --cert "$DIR/tls.crt" --key "$DIR/tls.key" >/dev/null
kubectl create secret generic tern-registry --from-literal=AWS_ACCESS_KEY_ID=check \
    --from-literal=AWS_SECRET_ACCESS_KEY=check \
    --from-literal=TERN_ADMIN_TOKEN="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')" >/dev/null

# Server-side validation: unknown or misspelt fields are errors, not warnings.
kubectl apply --validate=strict -f deploy/kubernetes/tern.yaml >/dev/null ||
    fail "kubectl apply deploy/kubernetes/tern.yaml"
kubectl apply --validate=strict -f deploy/kubernetes/fleet/ >/dev/null ||
    fail "kubectl apply deploy/kubernetes/fleet/"
ok "the API server accepts tern.yaml and fleet/ (strict field validation)"

kubectl rollout status deployment/tern --timeout=120s >/dev/null || fail "rollout of tern"
kubectl rollout status deployment/tern-fleet --timeout=120s >/dev/null || fail "rollout of tern-fleet"
wait_endpoints tern 2
wait_endpoints tern-admin 2
wait_endpoints tern-fleet 3
wait_endpoints tern-fleet-admin 3
ok "both Deployments Ready on the fake node; endpoints: tern 2, tern-fleet 3 (and their admin Services)"

# Every fleet pod gets its own name as TERN_REPLICA and the registry Secret as its environment.
pod=$(kubectl get pods -l app.kubernetes.io/name=tern-fleet -o jsonpath='{.items[0].metadata.name}')
spec=$(kubectl get pod "$pod" -o jsonpath='{.spec.containers[0].env[?(@.name=="TERN_REPLICA")].valueFrom.fieldRef.fieldPath} {.spec.containers[0].env[?(@.name=="TERN_ADVERTISE_URL")].value} {.spec.containers[0].envFrom[0].secretRef.name} {.spec.volumes[?(@.name=="cache")].emptyDir.sizeLimit}')
[ "$spec" = 'metadata.name http://$(POD_IP):9090 tern-registry 2Gi' ] || fail "fleet pod spec: $spec"
ip=$(kubectl get pod "$pod" -o jsonpath='{.status.podIP}')
[ -n "$ip" ] || fail "fleet pod $pod has no IP for TERN_ADVERTISE_URL"
ok "fleet pod $pod: TERN_REPLICA from its name, TERN_ADVERTISE_URL http://$ip:9090, env from Secret tern-registry, cache only in emptyDir"

allowed=$(kubectl get pdb tern-fleet -o jsonpath='{.status.currentHealthy}/{.status.expectedPods} {.status.disruptionsAllowed}')
[ "$allowed" = "3/3 1" ] || fail "PodDisruptionBudget tern-fleet: $allowed (healthy/expected allowed)"
ok "PodDisruptionBudget tern-fleet: 3/3 healthy, 1 disruption allowed"

# A voluntary eviction goes through the budget: one pod may go, the next is refused until a
# replacement is Ready.
pods=($(kubectl get pods -l app.kubernetes.io/name=tern-fleet -o jsonpath='{.items[*].metadata.name}'))
evict() {
    kubectl create --raw "/api/v1/namespaces/default/pods/$1/eviction" -f - 2>&1 <<EOF
{"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "$1", "namespace": "default"}}
EOF
}
evict "${pods[0]}" >/dev/null || fail "evicting ${pods[0]} with 1 disruption allowed"
second=$(evict "${pods[1]}" || true)
echo "$second" | grep -q "disruption budget" || fail "a second eviction was not refused: $second"
ok "eviction of ${pods[0]} allowed; ${pods[1]} refused at once: the budget allows one at a time"
kubectl rollout status deployment/tern-fleet --timeout=120s >/dev/null
wait_endpoints tern-fleet 3

# Roll a new image tag: maxUnavailable 0, so Ready endpoints never drop below 3.
kubectl set image deployment/tern-fleet tern=tern:check-2 >/dev/null
kubectl rollout status deployment/tern-fleet --timeout=180s >"$DIR/rollout.log" 2>&1 &
rollout=$!
min=3
while kill -0 "$rollout" 2>/dev/null; do
    n=$(ready_endpoints tern-fleet)
    [ "$n" -lt "$min" ] && min=$n
    sleep 0.2
done
wait "$rollout" || fail "rollout of tern:check-2: $(cat "$DIR/rollout.log")"
[ "$min" -ge 3 ] || fail "ready endpoints dropped to $min during the rollout"
sets=$(kubectl get rs -l app.kubernetes.io/name=tern-fleet -o jsonpath='{range .items[*]}{.spec.template.spec.containers[0].image}={.status.readyReplicas}/{.spec.replicas}{"\n"}{end}' | sort | tr '\n' ' ')
[ "$sets" = "tern:check-2=3/3 tern:latest=/0 " ] || fail "ReplicaSets after the rollout: $sets"
ok "rolled tern:check-2 to every fleet pod one at a time; ready endpoints never below 3; ReplicaSets: $sets"

# Scaling, as the HorizontalPodAutoscaler would (no metrics-server here, so it cannot by itself).
kubectl scale deployment/tern-fleet --replicas=5 >/dev/null
kubectl rollout status deployment/tern-fleet --timeout=60s >/dev/null || fail "scale to 5"
wait_endpoints tern-fleet 5
ok "scaled tern-fleet to 5: 5 ready endpoints"
hpa=$(kubectl get hpa tern-fleet -o jsonpath='{.spec.scaleTargetRef.name} {.spec.minReplicas}-{.spec.maxReplicas} {.spec.metrics[0].resource.target.averageUtilization}%')
[ "$hpa" = "tern-fleet 3-20 70%" ] || fail "HPA tern-fleet: $hpa"
kubectl get hpa tern >/dev/null || fail "HPA tern missing"
ok "HPAs tern and tern-fleet target their Deployments (tern-fleet: 3-20 replicas at 70% CPU)"

server=$(kubectl get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
echo "all checks passed on kube-apiserver $server (built by control-plane.sh) with kwok v0.8.0"
