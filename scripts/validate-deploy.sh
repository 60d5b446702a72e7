#!/usr/bin/env bash
# Checks the deployment files offline, without a cluster (a few seconds):
#
#   - every kustomization under deploy/kubernetes renders (`kubectl kustomize`),
#     and so does the one deploy/kubernetes/injector/gen-certs.sh writes (run
#     on a copy, in a temporary directory);
#   - what they render validates against Kubernetes' OpenAPI schemas
#     (`kubernetes-validate --strict`, Kubernetes $K8S_VERSION, default 1.29,
#     the first with native sidecars on by default). The custom resources
#     of other projects (cert-manager's Issuer and Certificate, the
#     Prometheus Operator's ServiceMonitor, Istio's EnvoyFilter, Contour's
#     HTTPProxy and ExtensionService) have no schema there: they, and only
#     they, are taken out before, and checked by hand instead (the fields
#     this repository relies on). Any other kind without a schema fails;
#   - the project's own rules on what they render: the Charon sidecar is
#     exactly the one `charon inject` adds (with each overlay's store); a
#     central Charon (charon.io/topology: central) has replicas on a shared
#     store, a shutdown delay inside its grace period, a Service, an
#     autoscaler, a disruption budget and a network policy; every
#     container runs non-root on a read-only root filesystem with resources
#     and probes, images are pinned, mounted ConfigMaps exist, the webhook is
#     configured as documented;
#   - the limits in deploy/ are a valid Charon configuration (`charon check`,
#     when a built charon binary is found: $CHARON_BIN, else target/debug or
#     target/release; skipped otherwise), and base/ratelimit.yaml is still a
#     copy of examples/envoy/ratelimit.yaml;
#   - `yamllint -s` (the repository's .yamllint) over deploy/ and examples/;
#   - `envoy --mode validate` on every Envoy bootstrap under deploy/ and
#     examples/.
#
# Tools: kubectl, kubernetes-validate, yamllint and envoy from the venv
# target/envoy-venv (scripts/test-deps.sh installs them when missing).
# Prints one line per check; exits non-zero if any fails.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
VENV="$ROOT/target/envoy-venv"
BIN="$VENV/bin"
K8S_VERSION="${K8S_VERSION:-1.29}"

tools_ok() {
    local tool
    for tool in kubectl kubernetes-validate yamllint envoy python; do
        [ -x "$BIN/$tool" ] || return 1
    done
}
if ! tools_ok; then
    echo "validate-deploy: installing the tools (scripts/test-deps.sh)" >&2
    bash scripts/test-deps.sh >/dev/null || { echo "FAIL  scripts/test-deps.sh"; exit 1; }
    tools_ok || { echo "FAIL  tools missing from $BIN"; exit 1; }
fi

# The release deploy/ must run (checks.py compares every charon image).
CHARON_VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)"
export CHARON_VERSION

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
checks=0

# check NAME COMMAND...: runs COMMAND, prints "ok" or "FAIL" and its output.
check() {
    local name="$1"
    shift
    checks=$((checks + 1))
    if "$@" >"$TMP/out" 2>&1; then
        printf 'ok    %s\n' "$name"
    else
        failures=$((failures + 1))
        printf 'FAIL  %s\n' "$name"
        sed 's/^/      /' "$TMP/out" | head -n 60
    fi
}
skip() { printf 'skip  %s\n' "$*"; }

# --- the checker for rendered manifests (Python, PyYAML from the venv) -----
cat >"$TMP/checks.py" <<'PYTHON'
"""Project rules on a rendered kustomization (see validate-deploy.sh)."""
import os
import sys

import yaml

# This release's image: deploy/ runs the version Cargo.toml says.
IMAGE = "charon:" + os.environ["CHARON_VERSION"]


# The sidecar `charon inject` adds (src/inject/review.rs), store aside.
def sidecar(store):
    return {
        "name": "charon",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": ["serve", "--config", "/etc/charon", "--grpc-addr", "127.0.0.1:8081",
                 "--admin-addr", "0.0.0.0:9102", "--store", store],
        "env": [{"name": "RUST_LOG", "value": "info"}],
        "ports": [{"name": "charon-admin", "containerPort": 9102, "protocol": "TCP"}],
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "charon-admin"},
                         "periodSeconds": 1, "failureThreshold": 30},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "charon-admin"},
                          "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "charon-admin"},
                           "periodSeconds": 5, "failureThreshold": 2},
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                      "limits": {"cpu": "1", "memory": "256Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "charon-config", "mountPath": "/etc/charon", "readOnly": True}],
    }

CRD_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate"),
             ("monitoring.coreos.com/v1", "ServiceMonitor"),
             ("networking.istio.io/v1alpha3", "EnvoyFilter"),
             ("projectcontour.io/v1alpha1", "ExtensionService"), ("projectcontour.io/v1", "HTTPProxy")}
CLUSTER_SCOPED = {"Namespace", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                  "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
INJECTOR_HOST = "charon-injector.charon-system.svc"
# Namespaces of other products that manifests here may put objects in
# without rendering them (Istio's EnvoyFilters go in istio-system).
EXTERNAL_NAMESPACES = {"istio-system"}

errors = []


def err(where, message):
    errors.append(f"{where}: {message}")


def name_of(doc):
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def pod_spec(doc):
    kind = doc.get("kind")
    spec = doc.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"):
        return spec.get("template", {}).get("spec")
    if kind == "CronJob":
        return spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec")
    if kind == "Pod":
        return spec
    return None


def check_pod(doc, store, names):
    where = name_of(doc)
    spec = pod_spec(doc)
    pod_sc = spec.get("securityContext", {})
    batch = doc["kind"] in ("Job", "CronJob")
    inits = spec.get("initContainers", [])
    for c in spec.get("containers", []) + inits:
        cw = f"{where} container {c.get('name')}"
        sidecar_like = c in spec.get("containers", []) or c.get("restartPolicy") == "Always"
        image = c.get("image", "")
        tag = image.rsplit("/", 1)[-1]
        if "@sha256:" not in image and (":" not in tag or tag.endswith(":latest")):
            err(cw, f"image {image!r} is not pinned to a tag or digest")
        if image.startswith("charon:") and image != IMAGE:
            err(cw, f"image {image!r} is not this release's, {IMAGE}")
        sc = c.get("securityContext", {})
        if not (sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True):
            err(cw, "runAsNonRoot is not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            err(cw, "runs as uid 0")
        if sc.get("readOnlyRootFilesystem") is not True:
            err(cw, "readOnlyRootFilesystem is not true")
        if sc.get("allowPrivilegeEscalation") is not False:
            err(cw, "allowPrivilegeEscalation is not false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            err(cw, "capabilities do not drop ALL")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            err(cw, "no RuntimeDefault seccomp profile")
        resources = c.get("resources", {})
        for part in ("requests", "limits"):
            for res in ("cpu", "memory"):
                if res not in resources.get(part, {}):
                    err(cw, f"no resources.{part}.{res}")
        if sidecar_like and not batch:
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in c:
                    err(cw, f"no {probe}")
    charons = [c for c in inits if c.get("name") == "charon"]
    central = doc.get("metadata", {}).get("labels", {}).get("charon.io/topology") == "central"
    if central:
        check_central(doc, spec, store)
    elif any(c.get("name") == "charon" for c in spec.get("containers", [])):
        err(where, "charon is a regular container, not a native sidecar (initContainers)")
    for c in charons:
        args = c.get("args", [])
        got = args[args.index("--store") + 1] if "--store" in args[:-1] else None
        if store is not None and got != store:
            err(where, f"the charon sidecar's store is {got!r}, expected {store!r}")
        if c != sidecar(got):
            want, have = sidecar(got), c
            diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            err(where, f"the charon sidecar differs from the injector's in: {', '.join(diff)}")
        if inits.index(c) != 0:
            err(where, "the charon sidecar is not the first init container")
        volumes = {v.get("name"): v for v in spec.get("volumes", [])}
        if "configMap" not in volumes.get("charon-config", {}):
            err(where, "no charon-config ConfigMap volume")
        elif volumes["charon-config"]["configMap"].get("items"):
            err(where, "charon-config mounts chosen items; mount the whole ConfigMap")
    for v in spec.get("volumes", []):
        cm = v.get("configMap", {}).get("name")
        if cm and ("ConfigMap", cm) not in names:
            err(where, f"volume {v.get('name')} mounts ConfigMap {cm}, which is not rendered")
    annotations = spec and doc["spec"].get("template", {}).get("metadata", {}).get("annotations", {})
    if annotations and annotations.get("charon.io/inject") == "true":
        cm = annotations.get("charon.io/config", "charon-limits")
        if ("ConfigMap", cm) not in names:
            err(where, f"charon.io/config names ConfigMap {cm}, which is not rendered")
        if charons:
            err(where, "annotated for injection but already has the sidecar")


def arg(args, flag):
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def check_central(doc, spec, store):
    """A central Charon (charon.io/topology: central): a Deployment of
    replicas on a shared store, drained the way a Service needs."""
    where = name_of(doc)
    charons = [c for c in spec.get("containers", []) if c.get("name") == "charon"]
    if len(charons) != 1:
        return err(where, "a central Charon has exactly one container named charon")
    c = charons[0]
    args = c.get("args", [])
    if c.get("image") != sidecar("memory")["image"]:
        err(where, f"image {c.get('image')!r} is not the sidecar's")
    if args[:1] != ["serve"]:
        err(where, "not `charon serve`")
    if arg(args, "--grpc-addr") != "0.0.0.0:8081":
        err(where, "--grpc-addr is not 0.0.0.0:8081 (the other pods call it)")
    got = arg(args, "--store")
    if got in (None, "memory"):
        err(where, "replicas on --store memory would each count alone")
    elif store is not None and got != store:
        err(where, f"the store is {got!r}, expected {store!r}")
    delay = arg(args, "--shutdown-delay")
    if not (delay and delay.endswith("s") and delay[:-1].isdigit()):
        err(where, "no --shutdown-delay in whole seconds (endpoint removal is asynchronous)")
    else:
        grace = spec.get("terminationGracePeriodSeconds", 30)
        # The delay, the drain (10 s) and the sessions' releases (5 s).
        if grace < int(delay[:-1]) + 15:
            err(where, f"terminationGracePeriodSeconds {grace} < --shutdown-delay {delay} + 15 s")
    probes = {p: c.get(p, {}).get("httpGet", {}).get("path")
              for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    if probes != {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}:
        err(where, f"probes are {probes}")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    if ports.get("grpc") != 8081:
        err(where, f"no container port grpc 8081: {ports}")
    if doc.get("spec", {}).get("replicas", 1) < 2:
        err(where, "fewer than 2 replicas")


def check_central_neighbours(docs):
    """What a central Charon needs around it: a Service on its gRPC port, an
    autoscaler from 2, a disruption budget, a network policy."""
    centrals = [d for d in docs if d.get("kind") == "Deployment"
                and d["metadata"].get("labels", {}).get("charon.io/topology") == "central"]
    for d in centrals:
        where = name_of(d)
        labels = d["spec"]["template"]["metadata"].get("labels", {})

        def selects(selector):
            return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

        services = [s for s in docs if s.get("kind") == "Service" and selects(s["spec"].get("selector", {}))]
        if not any(p.get("port") == 8081 and p.get("name") == "grpc"
                   for s in services for p in s["spec"].get("ports", [])):
            err(where, "no Service selects it with port grpc 8081")
        hpas = [h for h in docs if h.get("kind") == "HorizontalPodAutoscaler"
                and h["spec"].get("scaleTargetRef", {}).get("name") == d["metadata"]["name"]]
        if len(hpas) != 1 or hpas[0]["spec"].get("minReplicas", 1) < 2:
            err(where, "no HorizontalPodAutoscaler from at least 2 replicas")
        if not any(p.get("kind") == "PodDisruptionBudget"
                   and selects(p["spec"].get("selector", {}).get("matchLabels", {})) for p in docs):
            err(where, "no PodDisruptionBudget selects it")
        if not any(n.get("kind") == "NetworkPolicy"
                   and selects(n["spec"].get("podSelector", {}).get("matchLabels", {})) for n in docs):
            err(where, "no NetworkPolicy selects it")


def check_service_monitor(doc, docs):
    where, spec = name_of(doc), doc.get("spec", {})
    wanted = spec.get("selector", {}).get("matchLabels", {})
    services = [s for s in docs if s.get("kind") == "Service" and wanted
                and all(s["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())]
    if not services:
        return err(where, f"selector {wanted} matches no rendered Service")
    for endpoint in spec.get("endpoints", []):
        port = endpoint.get("port")
        if not any(p.get("name") == port for s in services for p in s["spec"].get("ports", [])):
            err(where, f"no selected Service has a port named {port!r}")
        if endpoint.get("path", "/metrics") != "/metrics":
            err(where, f"path {endpoint.get('path')!r} is not /metrics")
    if set(spec) - {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels"}:
        err(where, f"unexpected spec fields {sorted(spec)}")


def limits_by_domain(docs):
    """Domain -> the descriptor keys (every level) of the charon-limits files."""
    domains = {}
    for d in docs:
        if d.get("kind") == "ConfigMap" and d["metadata"].get("name") == "charon-limits":
            for text in d.get("data", {}).values():
                config = yaml.safe_load(text) or {}
                keys = domains.setdefault(config.get("domain"), set())
                stack = list(config.get("descriptors", []))
                while stack:
                    node = stack.pop()
                    keys.add(node.get("key"))
                    stack.extend(node.get("descriptors", []))
    return domains


def service_port(docs, name, namespace, port):
    return any(s.get("kind") == "Service" and s["metadata"].get("name") == name
               and s["metadata"].get("namespace") == namespace
               and any(p.get("port") == port for p in s["spec"].get("ports", []))
               for s in docs)


def check_istio(docs, envoy_out):
    """Istio's EnvoyFilters: the rate-limit filter names a rendered Service's
    gRPC port through Istio's cluster, a configured domain, and routes whose
    descriptor keys the limits know. Their Envoy parts, in a bootstrap of
    their own, go to `envoy --mode validate` (written to envoy_out)."""
    filters = [d for d in docs if d.get("kind") == "EnvoyFilter"]
    if not filters:
        return
    domains = limits_by_domain(docs)
    http_filter, rate_limits, domain = None, None, None
    for d in filters:
        for patch in d.get("spec", {}).get("configPatches", []):
            value = patch.get("patch", {}).get("value", {})
            if patch.get("applyTo") == "HTTP_FILTER" and value.get("name") == "envoy.filters.http.ratelimit":
                http_filter = value
                config = value.get("typed_config", {})
                domain = config.get("domain")
                if domain not in domains:
                    err(name_of(d), f"domain {domain!r} is in no charon-limits file")
                cluster = (config.get("rate_limit_service", {}).get("grpc_service", {})
                           .get("envoy_grpc", {}).get("cluster_name", ""))
                parts = cluster.split("|")
                host = parts[3].split(".") if len(parts) == 4 else []
                if (len(parts) != 4 or parts[0] != "outbound" or len(host) < 3
                        or not service_port(docs, host[0], host[1], int(parts[1] or 0))):
                    err(name_of(d), f"cluster {cluster!r} is not a rendered Service's port")
                if config.get("rate_limit_service", {}).get("transport_api_version") != "V3":
                    err(name_of(d), "transport_api_version is not V3")
            if patch.get("applyTo") == "VIRTUAL_HOST":
                rate_limits = value.get("rate_limits")
    if http_filter is None or rate_limits is None:
        return err("EnvoyFilter", "no rate-limit HTTP filter and virtual host rate_limits")
    for limit in rate_limits:
        for action in limit.get("actions", []):
            key = action.get("request_headers", {}).get("descriptor_key")
            if key is not None and key not in domains.get(domain, set()):
                err("EnvoyFilter", f"descriptor key {key!r} is limited in no file of domain {domain!r}")
    typed = dict(http_filter["typed_config"])
    service = dict(typed["rate_limit_service"])
    service["grpc_service"] = {"envoy_grpc": {"cluster_name": "charon"}}
    typed["rate_limit_service"] = service
    bootstrap = {"static_resources": {
        "listeners": [{"name": "gateway", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}},
                       "filter_chains": [{"filters": [{
                           "name": "envoy.filters.network.http_connection_manager",
                           "typed_config": {
                               "@type": "type.googleapis.com/envoy.extensions.filters.network."
                                        "http_connection_manager.v3.HttpConnectionManager",
                               "stat_prefix": "gateway",
                               "route_config": {"virtual_hosts": [{
                                   "name": "all", "domains": ["*"], "rate_limits": rate_limits,
                                   "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]},
                               "http_filters": [{"name": http_filter["name"], "typed_config": typed},
                                                {"name": "envoy.filters.http.router", "typed_config": {
                                                    "@type": "type.googleapis.com/envoy.extensions.filters."
                                                             "http.router.v3.Router"}}]}}]}]}],
        "clusters": [{"name": "charon", "type": "STATIC",
                      "typed_extension_protocol_options": {
                          "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                              "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                              "explicit_http_config": {"http2_protocol_options": {}}}},
                      "load_assignment": {"cluster_name": "charon", "endpoints": [{"lb_endpoints": [{
                          "endpoint": {"address": {"socket_address": {
                              "address": "127.0.0.1", "port_value": 8081}}}}]}]}}]}}
    with open(envoy_out, "w") as f:
        yaml.safe_dump(bootstrap, f, sort_keys=False)


def check_contour(docs):
    """Contour's objects: the ExtensionService names a rendered Service's
    port; an HTTPProxy's descriptors are limited in domain `contour`."""
    keys = limits_by_domain(docs).get("contour", set())
    for d in docs:
        where, spec = name_of(d), d.get("spec", {})
        if d.get("kind") == "ExtensionService":
            if spec.get("protocol") != "h2c":
                err(where, "protocol is not h2c (Charon's gRPC port is plaintext here)")
            for service in spec.get("services", []):
                if not service_port(docs, service.get("name"), d["metadata"].get("namespace"), service.get("port")):
                    err(where, f"service {service} is not a rendered Service's port")
        if d.get("kind") == "HTTPProxy":
            policies = [spec.get("virtualhost", {}).get("rateLimitPolicy", {})]
            policies += [r.get("rateLimitPolicy", {}) for r in spec.get("routes", [])]
            entries = [e for p in policies for desc in p.get("global", {}).get("descriptors", [])
                       for e in desc.get("entries", [])]
            if not entries:
                err(where, "no global rate-limit descriptors")
            for entry in entries:
                key = {"remoteAddress": "remote_address", "genericKey": "generic_key",
                       "requestHeader": (entry.get("requestHeader") or {}).get("descriptorKey")}.get(next(iter(entry)))
                if key not in keys:
                    err(where, f"descriptor {entry} sends key {key!r}, limited in no file of domain 'contour'")


def check_webhook(doc, docs):
    where = name_of(doc)
    hooks = doc.get("webhooks", [])
    if len(hooks) != 1:
        return err(where, f"{len(hooks)} webhooks, expected 1")
    h = hooks[0]
    want = {
        "name": "inject.charon.io",
        "failurePolicy": "Ignore",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 2,
        "reinvocationPolicy": "Never",
        "namespaceSelector": {"matchLabels": {"charon.io/injection": "enabled"}},
    }
    for key, value in want.items():
        if h.get(key) != value:
            err(where, f"{key} is {h.get(key)!r}, expected {value!r}")
    service = h.get("clientConfig", {}).get("service", {})
    got = (service.get("namespace"), service.get("name"), service.get("path"), service.get("port", 443))
    if got != ("charon-system", "charon-injector", "/mutate", 443):
        err(where, f"clientConfig.service is {got}")
    rules = h.get("rules", [])
    if not (len(rules) == 1 and rules[0].get("operations") == ["CREATE"]
            and rules[0].get("resources") == ["pods"] and rules[0].get("apiGroups") == [""]):
        err(where, f"rules are {rules}, expected pods CREATE only")
    services = [d for d in docs if d.get("kind") == "Service"
                and d["metadata"].get("name") == "charon-injector"]
    for s in services:
        ports = [(p.get("port"), p.get("targetPort")) for p in s["spec"].get("ports", [])]
        if ports != [(443, "https")] and ports != [(443, 8443)]:
            err(name_of(s), f"ports are {ports}, expected 443 -> 8443")
    inject_from = doc["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
    certs = {(d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if (d.get("apiVersion"), d.get("kind")) == ("cert-manager.io/v1", "Certificate")}
    if certs and inject_from is None:
        err(where, "a Certificate is rendered but no cert-manager.io/inject-ca-from annotation")
    if inject_from is not None:
        ns, _, name = inject_from.partition("/")
        if (ns, name) not in certs:
            err(where, f"cert-manager.io/inject-ca-from names {inject_from}, which is not rendered")
    bundle = h.get("clientConfig", {}).get("caBundle")
    secrets = [d for d in docs if d.get("kind") == "Secret"
               and d["metadata"].get("name") == "charon-injector-tls"]
    for s in secrets:
        data = s.get("data", {})
        if s.get("type") != "kubernetes.io/tls" or not {"tls.crt", "tls.key"} <= set(data):
            err(name_of(s), "not a kubernetes.io/tls Secret with tls.crt and tls.key")
        if bundle != data.get("ca.crt"):
            err(where, "caBundle is not the Secret's ca.crt")


def check_crds(docs):
    """cert-manager kinds: no schema in kubernetes-validate, so by hand."""
    issuers = {(d["metadata"].get("namespace"), d["metadata"].get("name"))
               for d in docs if (d.get("apiVersion"), d.get("kind")) == ("cert-manager.io/v1", "Issuer")}
    for d in docs:
        av, kind = d.get("apiVersion"), d.get("kind")
        if (av, kind) not in CRD_KINDS:
            continue
        where, spec = name_of(d), d.get("spec", {})
        if set(d) - {"apiVersion", "kind", "metadata", "spec"}:
            err(where, f"unexpected top-level fields {sorted(set(d) - {'apiVersion', 'kind', 'metadata', 'spec'})}")
        if not d.get("metadata", {}).get("namespace"):
            err(where, "no namespace")
        if kind == "Issuer":
            known = {"selfSigned", "ca", "acme", "vault", "venafi"}
            if len(set(spec) & known) != 1 or set(spec) - known:
                err(where, f"spec has {sorted(spec)}, expected exactly one issuer type")
        if kind == "Certificate":
            allowed = {"secretName", "commonName", "dnsNames", "duration", "renewBefore", "privateKey",
                       "usages", "issuerRef", "subject", "secretTemplate", "isCA", "ipAddresses",
                       "uris", "emailAddresses", "revisionHistoryLimit", "keystores",
                       "encodeUsagesInRequest", "literalSubject", "additionalOutputFormats",
                       "nameConstraints", "otherNames", "renewBeforePercentage"}
            if set(spec) - allowed:
                err(where, f"unknown spec fields {sorted(set(spec) - allowed)}")
            if spec.get("secretName") != "charon-injector-tls":
                err(where, f"secretName is {spec.get('secretName')!r}")
            if INJECTOR_HOST not in spec.get("dnsNames", []):
                err(where, f"dnsNames lack {INJECTOR_HOST}")
            ref = spec.get("issuerRef", {})
            if ref.get("kind", "Issuer") == "Issuer" and (d["metadata"].get("namespace"), ref.get("name")) not in issuers:
                err(where, f"issuerRef names Issuer {ref.get('name')}, which is not rendered")
            pk = spec.get("privateKey", {})
            if pk.get("encoding") != "PKCS8":
                err(where, "privateKey.encoding is not PKCS8")


def main():
    rendered, core_out, store = sys.argv[1], sys.argv[2], sys.argv[3]
    store = None if store == "-" else store
    with open(rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    names = {(d.get("kind"), d.get("metadata", {}).get("name")) for d in docs}
    namespaces = {d["metadata"]["name"] for d in docs if d.get("kind") == "Namespace"}
    for d in docs:
        kind = d.get("kind")
        if kind not in CLUSTER_SCOPED:
            ns = d.get("metadata", {}).get("namespace")
            if not ns:
                err(name_of(d), "no namespace")
            elif namespaces and ns not in namespaces and ns not in EXTERNAL_NAMESPACES:
                err(name_of(d), f"namespace {ns} is not rendered")
        if pod_spec(d) is not None:
            check_pod(d, store, names)
        if kind == "MutatingWebhookConfiguration":
            check_webhook(d, docs)
        if kind == "ServiceMonitor":
            check_service_monitor(d, docs)
    check_central_neighbours(docs)
    check_istio(docs, core_out.replace(".core.yaml", ".envoy.yaml"))
    check_contour(docs)
    check_crds(docs)
    # What kubernetes-validate gets: everything but the cert-manager kinds.
    with open(core_out, "w") as f:
        yaml.safe_dump_all([d for d in docs if (d.get("apiVersion"), d.get("kind")) not in CRD_KINDS],
                           f, sort_keys=False)
    crds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs
                  if (d.get("apiVersion"), d.get("kind")) in CRD_KINDS)
    if crds:
        print(f"(checked by hand, no schema: {', '.join(crds)})")
    for e in errors:
        print(e)
    sys.exit(1 if errors else 0)


main()
PYTHON

# render_and_check LABEL DIR STORE: kustomize, schemas, project rules.
# STORE: the Charon sidecar's expected --store, or "-" for "any".
render_and_check() {
    local label="$1" dir="$2" store="$3"
    local out="$TMP/${label//\//_}"
    check "kubectl kustomize: $label" "$BIN/kubectl" kustomize "$dir" -o "$out.yaml"
    [ -s "$out.yaml" ] || return 0
    local what="project rules"
    if [ "$store" != "-" ]; then
        local short="${store%%,*}"
        [ "$short" = "$store" ] || short="$short,..."
        what="project rules (sidecar --store $short)"
    fi
    check "$what: $label" "$BIN/python" "$TMP/checks.py" "$out.yaml" "$out.core.yaml" "$store"
    [ -s "$out.core.yaml" ] || return 0
    check "kubernetes-validate --strict -k $K8S_VERSION: $label" validate_schemas "$out.core.yaml"
    # Istio's EnvoyFilters: their Envoy parts, as a bootstrap (checks.py).
    if [ -s "$out.envoy.yaml" ]; then
        check "envoy --mode validate: the EnvoyFilters of $label" \
            "$BIN/envoy" --mode validate -c "$out.envoy.yaml" -l warn
    fi
}
validate_schemas() {
    # A kind without a schema is only a warning to kubernetes-validate: fail
    # on it here (the cert-manager kinds were taken out on purpose).
    "$BIN/kubernetes-validate" --strict -k "$K8S_VERSION" --quiet "$1" 2>&1 | tee "$TMP/kv"
    local rc="${PIPESTATUS[0]}"
    if grep -q "Couldn't find schema" "$TMP/kv"; then return 1; fi
    return "$rc"
}

# --- kustomizations -------------------------------------------------------
# DEPLOY_DIR: another tree to check (the script's own tests use a copy).
K="${DEPLOY_DIR:-deploy/kubernetes}"
CLUSTER_SEEDS="charon-redis-cluster-0.charon-redis-cluster:6379,charon-redis-cluster-1.charon-redis-cluster:6379"
CLUSTER_SEEDS="$CLUSTER_SEEDS,charon-redis-cluster-2.charon-redis-cluster:6379"
SENTINELS="charon-redis-sentinel-0.charon-redis-sentinel:26379,charon-redis-sentinel-1.charon-redis-sentinel:26379"
SENTINELS="$SENTINELS,charon-redis-sentinel-2.charon-redis-sentinel:26379"
declare -A STORE=(
    ["$K/base"]=memory
    ["$K/overlays/memory"]=memory
    ["$K/overlays/redis"]="redis://charon-redis:6379"
    ["$K/overlays/redis-cluster"]="redis+cluster://$CLUSTER_SEEDS"
    ["$K/central/base"]="redis://charon-redis:6379"
    ["$K/central/redis"]="redis://charon-redis:6379"
    ["$K/central/redis-cluster"]="redis+cluster://$CLUSTER_SEEDS"
    ["$K/central/sentinel"]="redis+sentinel://$SENTINELS/charon"
)
# Every directory with a kustomization, entry point or not (a base renders
# on its own too); a new overlay is checked without being listed here.
while IFS= read -r file; do
    dir="$(dirname "$file")"
    case "$dir" in "$K/injector/certs") continue ;; esac # gen-certs.sh output, checked below
    render_and_check "${dir#"$K"/}" "$dir" "${STORE[$dir]:--}"
done < <(find "$K" -name kustomization.yaml -not -path '*/certs/*' | sort)

# The openssl path: gen-certs.sh on a copy of the injector, then its
# kustomization, and the certificate itself.
gen_certs() {
    cp -r "$K/injector" "$TMP/injector"
    rm -rf "$TMP/injector/certs"
    bash "$TMP/injector/gen-certs.sh" >"$TMP/cabundle" || return 1
    local c="$TMP/injector/certs"
    openssl verify -CAfile "$c/ca.crt" "$c/tls.crt" || return 1
    openssl x509 -in "$c/tls.crt" -noout -ext subjectAltName | grep -q "DNS:charon-injector.charon-system.svc\b" || {
        echo "no SAN charon-injector.charon-system.svc"
        return 1
    }
    grep -q "BEGIN PRIVATE KEY" "$c/tls.key" || { echo "tls.key is not PKCS#8"; return 1; }
    [ "$(tail -n1 "$TMP/cabundle")" = "$(openssl base64 -A <"$c/ca.crt")" ] || {
        echo "printed caBundle is not ca.crt"
        return 1
    }
    # A second run keeps the CA (the caBundle does not change).
    bash "$TMP/injector/gen-certs.sh" 2>/dev/null | tail -n1 | cmp -s - <(tail -n1 "$TMP/cabundle") || {
        echo "a second run changed the CA"
        return 1
    }
}
if command -v openssl >/dev/null 2>&1; then
    check "gen-certs.sh (CA, serving certificate for charon-injector.charon-system.svc, PKCS#8 key)" gen_certs
    if [ -f "$TMP/injector/certs/kustomization.yaml" ]; then
        render_and_check "injector/certs (written by gen-certs.sh)" "$TMP/injector/certs" -
    fi
else
    skip "gen-certs.sh: no openssl"
fi
check "bash -n gen-certs.sh, validate-deploy.sh" bash -n "$K/injector/gen-certs.sh" scripts/validate-deploy.sh
if command -v shellcheck >/dev/null 2>&1; then
    check "shellcheck" shellcheck "$K/injector/gen-certs.sh" scripts/validate-deploy.sh
fi

# --- limits ---------------------------------------------------------------
check "base/ratelimit.yaml is a copy of examples/envoy/ratelimit.yaml" \
    cmp "$K/base/ratelimit.yaml" examples/envoy/ratelimit.yaml
CHARON="${CHARON_BIN:-}"
if [ -z "$CHARON" ]; then
    for candidate in target/debug/charon target/release/charon; do
        if [ -x "$candidate" ]; then CHARON="$candidate"; break; fi
    done
fi
for limits in "$K/base/ratelimit.yaml" "$K/injector/example/limits.yaml" \
    "$K/central/base/ratelimit.yaml" "$K/central/base/contour.yaml"; do
    if [ -n "$CHARON" ]; then
        check "charon check $limits ($CHARON)" "$CHARON" check "$limits"
    else
        skip "charon check $limits: no charon binary (set CHARON_BIN or build)"
    fi
done

# --- observability ---------------------------------------------------------
# The PodMonitor (a Prometheus Operator kind, no schema): the ports it keeps
# are the ones the sidecars declare.
pod_monitor() {
    "$BIN/python" - <<'PYTHON'
import sys
import yaml

doc = yaml.safe_load(open("deploy/observability/pod-monitor.yaml"))
assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor"), doc["kind"]
spec = doc["spec"]
assert set(spec) <= {"namespaceSelector", "selector", "podMetricsEndpoints"}, sorted(spec)
ports = [e["port"] for e in spec["podMetricsEndpoints"]]
assert ports == ["charon-admin", "throttle-admin"], ports
assert all(e.get("path") == "/metrics" for e in spec["podMetricsEndpoints"])
declared = open("deploy/kubernetes/base/demo-app.yaml").read()
for port in ports:
    assert f"name: {port}," in declared, f"no container port {port} in the demo app"
PYTHON
}
check "observability/pod-monitor.yaml keeps the sidecars' admin ports" pod_monitor

# --- the release -----------------------------------------------------------
same_release() {
    grep -q "org.opencontainers.image.version=\"$CHARON_VERSION\"" Dockerfile || {
        echo "Dockerfile's image version label is not $CHARON_VERSION"
        return 1
    }
    grep -q "^## \[$CHARON_VERSION\]" CHANGELOG.md || {
        echo "CHANGELOG.md has no section for $CHARON_VERSION"
        return 1
    }
    grep -q "^## \[Unreleased\]" CHANGELOG.md || {
        echo "CHANGELOG.md has no Unreleased section"
        return 1
    }
}
check "Cargo.toml's version $CHARON_VERSION in the Dockerfile's label and CHANGELOG.md" same_release

# --- yamllint -------------------------------------------------------------
check "yamllint -s deploy examples (.yamllint)" "$BIN/yamllint" -s -c .yamllint deploy examples

# --- Envoy ----------------------------------------------------------------
envoy_configs=()
while IFS= read -r file; do envoy_configs+=("$file"); done \
    < <(grep -rlE --include='*.yaml' '^static_resources:' deploy examples | sort)
if [ "${#envoy_configs[@]}" -lt 2 ]; then
    checks=$((checks + 1))
    failures=$((failures + 1))
    echo "FAIL  Envoy configs: found ${#envoy_configs[@]}, expected examples/envoy/envoy.yaml and deploy's"
fi
for config in "${envoy_configs[@]}"; do
    check "envoy --mode validate -c $config" "$BIN/envoy" --mode validate -c "$config" -l warn
done

echo "validate-deploy: $((checks - failures))/$checks checks passed"
[ "$failures" -eq 0 ]
