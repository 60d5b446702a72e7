//! The decision of the webhook, pure: an AdmissionReview in, an
//! AdmissionReview out, with a JSONPatch that adds Charon as a native sidecar
//! to a pod that asks for it. Anything not understood is admitted unchanged
//! and says why (the webhook never blocks a pod).

use base64::Engine;
use serde_json::{Value, json};

use super::throttle::{self, THROTTLE, THROTTLE_SIDECAR};

/// Pods opt in with `charon.io/inject: "true"`.
pub const INJECT: &str = "charon.io/inject";
/// The ConfigMap with the limits (default [`DEFAULT_CONFIG`]).
pub const CONFIG: &str = "charon.io/config";
/// Optional: the sidecar's `--store` (default: the injector's `--store`).
pub const STORE: &str = "charon.io/store";
/// Optional: a Secret whose key `token` becomes the sidecar's
/// `--admin-token-file` (docs/operations.md#admin-access).
pub const ADMIN_TOKEN_SECRET: &str = "charon.io/admin-token-secret";
/// Set on injected pods.
pub const INJECTED: &str = "charon.io/injected";
pub const DEFAULT_CONFIG: &str = "charon-limits";
/// The sidecar container's name: a pod that has one is left alone.
pub const SIDECAR: &str = "charon";
const VOLUME: &str = "charon-config";
/// Optional: a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) for TLS on
/// the sidecar's gRPC port.
pub const GRPC_TLS_SECRET: &str = "charon.io/grpc-tls-secret";
/// Optional, with [`GRPC_TLS_SECRET`]: a Secret whose `ca.crt` signs the
/// client certificates the sidecar requires (mTLS).
pub const GRPC_CLIENT_CA_SECRET: &str = "charon.io/grpc-client-ca-secret";

/// A Secret a pod names in an annotation: mounted read-only for the
/// sidecar, its files named to it by flags.
struct SecretMount {
    annotation: &'static str,
    volume: &'static str,
    dir: &'static str,
    /// (key in the Secret, flag that reads the file).
    files: &'static [(&'static str, &'static str)],
}

const SECRET_MOUNTS: [SecretMount; 3] = [
    SecretMount {
        annotation: ADMIN_TOKEN_SECRET,
        volume: "charon-admin-token",
        dir: "/etc/charon-admin",
        files: &[("token", "--admin-token-file")],
    },
    SecretMount {
        annotation: GRPC_TLS_SECRET,
        volume: "charon-grpc-tls",
        dir: "/etc/charon-tls",
        files: &[
            ("tls.crt", "--grpc-tls-cert"),
            ("tls.key", "--grpc-tls-key"),
        ],
    },
    SecretMount {
        annotation: GRPC_CLIENT_CA_SECRET,
        volume: "charon-grpc-client-ca",
        dir: "/etc/charon-client-ca",
        files: &[("ca.crt", "--grpc-client-ca")],
    },
];

/// What the injector puts in pods.
#[derive(Debug, Clone)]
pub struct SidecarTemplate {
    pub image: String,
    /// `--store` unless the pod names one.
    pub store: String,
}

/// The image of this release, as `deploy/` names it: `charon:<version>`.
pub const IMAGE: &str = concat!("charon:", env!("CARGO_PKG_VERSION"));

impl Default for SidecarTemplate {
    fn default() -> Self {
        Self {
            image: IMAGE.into(),
            store: "memory".into(),
        }
    }
}

/// The outcome for one review, and why (for the log).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The AdmissionReview to answer.
    pub response: Value,
    pub patched: bool,
    pub reason: String,
}

/// A body that is not an AdmissionReview with a request uid: nothing can be
/// answered in the protocol (the API server then applies the webhook's
/// `failurePolicy: Ignore`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error("not an admission.k8s.io/v1 AdmissionReview with request.uid")]
    NotAReview,
}

/// Decides one review (the request body).
pub fn review(body: &[u8], template: &SidecarTemplate) -> Result<Verdict, ReviewError> {
    let review: Value =
        serde_json::from_slice(body).map_err(|error| ReviewError::NotJson(error.to_string()))?;
    let request = review.get("request").ok_or(ReviewError::NotAReview)?;
    let uid = request
        .get("uid")
        .and_then(Value::as_str)
        .filter(|uid| !uid.is_empty())
        .ok_or(ReviewError::NotAReview)?;
    let api_version = review
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("admission.k8s.io/v1");
    let (patch, reason) = match plan(request, template) {
        Ok(patch) => (Some(patch), "injected".to_owned()),
        Err(reason) => (None, reason),
    };
    let mut response = json!({ "uid": uid, "allowed": true });
    if let Some(patch) = &patch {
        let encoded = base64::engine::general_purpose::STANDARD.encode(patch.to_string());
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(encoded);
    }
    Ok(Verdict {
        response: json!({
            "apiVersion": api_version,
            "kind": "AdmissionReview",
            "response": response,
        }),
        patched: patch.is_some(),
        reason,
    })
}

/// The JSONPatch for a pod, or why it is left alone.
fn plan(request: &Value, template: &SidecarTemplate) -> Result<Value, String> {
    let kind = request.pointer("/kind/kind").and_then(Value::as_str);
    if kind != Some("Pod") {
        return Err(format!("not a Pod ({})", kind.unwrap_or("no kind")));
    }
    let pod = request
        .get("object")
        .filter(|object| object.is_object())
        .ok_or("no pod object in the request")?;
    let annotations = pod.pointer("/metadata/annotations");
    let annotation = |name: &str| {
        annotations
            .and_then(|a| a.get(name))
            .and_then(Value::as_str)
    };
    match annotation(INJECT) {
        None => return Err(format!("no {INJECT} annotation")),
        Some("true") => {}
        Some("false") => return Err(format!("{INJECT} is \"false\"")),
        Some(other) => {
            return Err(format!(
                "{INJECT} is {other:?}; only \"true\" injects (\"false\" or no annotation does not)"
            ));
        }
    }
    let spec = pod.get("spec").ok_or("the pod has no spec")?;
    let containers = spec
        .get("containers")
        .and_then(Value::as_array)
        .filter(|containers| !containers.is_empty())
        .ok_or("the pod has no containers")?;
    let init_containers = spec.get("initContainers").and_then(Value::as_array);
    let named_charon = |list: &Vec<Value>| {
        list.iter()
            .any(|c| c.get("name").and_then(Value::as_str) == Some(SIDECAR))
    };
    if named_charon(containers) || init_containers.is_some_and(named_charon) {
        return Err(format!("already has a container named {SIDECAR:?}"));
    }
    let throttled = annotation(THROTTLE).map(throttle::app_port).transpose()?;
    let named_throttle = |list: &Vec<Value>| {
        list.iter()
            .any(|c| c.get("name").and_then(Value::as_str) == Some(THROTTLE_SIDECAR))
    };
    if throttled.is_some()
        && (named_throttle(containers) || init_containers.is_some_and(named_throttle))
    {
        return Err(format!(
            "already has a container named {THROTTLE_SIDECAR:?}"
        ));
    }
    let volumes = spec.get("volumes").and_then(Value::as_array);
    let ours = std::iter::once(VOLUME).chain(SECRET_MOUNTS.iter().map(|m| m.volume));
    for taken in ours {
        if volumes.is_some_and(|volumes| {
            volumes
                .iter()
                .any(|v| v.get("name").and_then(Value::as_str) == Some(taken))
        }) {
            return Err(format!("already has a volume named {taken:?}"));
        }
    }
    let mut secrets = Vec::new();
    for mount in &SECRET_MOUNTS {
        if let Some(secret) = annotation(mount.annotation) {
            if !is_dns_subdomain(secret) {
                return Err(format!(
                    "{} {secret:?} is not a valid Secret name",
                    mount.annotation
                ));
            }
            secrets.push((mount, secret));
        }
    }
    if annotation(GRPC_CLIENT_CA_SECRET).is_some() && annotation(GRPC_TLS_SECRET).is_none() {
        return Err(format!(
            "{GRPC_CLIENT_CA_SECRET} needs {GRPC_TLS_SECRET}: client certificates need TLS"
        ));
    }
    let config = annotation(CONFIG).unwrap_or(DEFAULT_CONFIG);
    if !is_dns_subdomain(config) {
        return Err(format!("{CONFIG} {config:?} is not a valid ConfigMap name"));
    }
    let store = annotation(STORE).unwrap_or(&template.store);
    if !is_store(store) {
        return Err(format!(
            "{STORE} {:?} is not `memory` or a Redis URL",
            redact(store)
        ));
    }

    let mut patch = Vec::new();
    let mut sidecar = sidecar(&template.image, store);
    let mut new_volumes = vec![json!({"name": VOLUME, "configMap": {"name": config}})];
    for (mount, secret) in secrets {
        with_secret(&mut sidecar, mount);
        let items: Vec<Value> = mount
            .files
            .iter()
            .map(|(key, _)| json!({"key": key, "path": key}))
            .collect();
        new_volumes.push(json!({
            "name": mount.volume,
            "secret": {"secretName": secret, "items": items}
        }));
    }
    // First among init containers: they run before (and beside) the others.
    let mut ours = vec![sidecar];
    if let Some(port) = throttled {
        ours.push(throttle::throttle_sidecar(&template.image, port));
    }
    match init_containers {
        Some(_) => {
            for (at, container) in ours.into_iter().enumerate() {
                patch.push(json!({"op": "add", "path": format!("/spec/initContainers/{at}"), "value": container}));
            }
        }
        None => patch.push(json!({"op": "add", "path": "/spec/initContainers", "value": ours})),
    }
    match volumes {
        Some(_) => {
            for volume in new_volumes {
                patch.push(json!({"op": "add", "path": "/spec/volumes/-", "value": volume}));
            }
        }
        None => patch.push(json!({"op": "add", "path": "/spec/volumes", "value": new_volumes})),
    }
    let marker = format!(
        "/metadata/annotations/{}",
        INJECTED.replace('~', "~0").replace('/', "~1")
    );
    match annotations {
        Some(_) => patch.push(json!({"op": "add", "path": marker, "value": "true"})),
        None => patch.push(
            json!({"op": "add", "path": "/metadata/annotations", "value": {INJECTED: "true"}}),
        ),
    }
    Ok(Value::Array(patch))
}

/// The native sidecar (an init container that keeps running), the same as
/// in `deploy/kubernetes/`.
pub fn sidecar(image: &str, store: &str) -> Value {
    json!({
        "name": SIDECAR,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": ["serve", "--config", "/etc/charon", "--grpc-addr", "127.0.0.1:8081",
                 "--admin-addr", "0.0.0.0:9102", "--store", store],
        "env": [{"name": "RUST_LOG", "value": "info"}],
        "ports": [{"name": "charon-admin", "containerPort": 9102, "protocol": "TCP"}],
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "charon-admin"}, "periodSeconds": 1, "failureThreshold": 30},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "charon-admin"}, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "charon-admin"}, "periodSeconds": 5, "failureThreshold": 2},
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}
        },
        "volumeMounts": [{"name": VOLUME, "mountPath": "/etc/charon", "readOnly": true}]
    })
}

/// The sidecar reads `mount`'s files where the Secret is mounted.
fn with_secret(sidecar: &mut Value, mount: &SecretMount) {
    if let Some(args) = sidecar["args"].as_array_mut() {
        for (key, flag) in mount.files {
            args.push(json!(flag));
            args.push(json!(format!("{}/{key}", mount.dir)));
        }
    }
    if let Some(mounts) = sidecar["volumeMounts"].as_array_mut() {
        mounts.push(json!({"name": mount.volume, "mountPath": mount.dir, "readOnly": true}));
    }
}

/// RFC 1123 subdomain, as Kubernetes object names.
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn is_store(store: &str) -> bool {
    store == "memory" || crate::store::redis::url::parse(store).is_ok()
}

/// A store URL without its password, for logs.
fn redact(store: &str) -> String {
    match (store.find("://"), store.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://…@{}", &store[..scheme], &store[at + 1..])
        }
        _ => store.to_owned(),
    }
}

#[cfg(test)]
mod tests;
