//! The throttling sidecar in a pod (docs/design.md#the-throttling-sidecar):
//! with `charon.io/throttle: "PORT"` beside `charon.io/inject: "true"`, the
//! webhook also adds `charon throttle` as a native sidecar, listening on
//! [`THROTTLE_PORT`] in front of the app's PORT. The pod's Service then
//! sends its traffic to [`THROTTLE_PORT`] (named `charon-throttle`).

use serde_json::{Value, json};

/// The app's port, which the throttling sidecar forwards to.
pub const THROTTLE: &str = "charon.io/throttle";
/// The throttling sidecar container's name.
pub const THROTTLE_SIDECAR: &str = "charon-throttle";
/// Where the throttling sidecar listens, for the pod's traffic.
pub const THROTTLE_PORT: u16 = 8090;
/// Its admin port: `/readyz` (and its alias `/ready`), `/healthz`,
/// `/stats`, `/metrics`.
pub const THROTTLE_ADMIN_PORT: u16 = 9103;

/// The app port an annotation names, or why it names none.
pub fn app_port(value: &str) -> Result<u16, String> {
    match value.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("{THROTTLE} {value:?} is not a port (1 to 65535)")),
        Ok(port) if port == THROTTLE_PORT || port == THROTTLE_ADMIN_PORT => Err(format!(
            "{THROTTLE} {port}: the throttling sidecar itself listens there"
        )),
        Ok(port) => Ok(port),
    }
}

/// The throttling sidecar in front of `app_port`, the same as in
/// `deploy/kubernetes/`.
pub fn throttle_sidecar(image: &str, app_port: u16) -> Value {
    json!({
        "name": THROTTLE_SIDECAR,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "restartPolicy": "Always",
        "args": ["throttle", "--listen", format!("0.0.0.0:{THROTTLE_PORT}"),
                 "--upstream", format!("http://127.0.0.1:{app_port}"), "--adaptive",
                 "--admin-addr", format!("0.0.0.0:{THROTTLE_ADMIN_PORT}")],
        "env": [{"name": "RUST_LOG", "value": "info"}],
        "ports": [
            {"name": "charon-throttle", "containerPort": THROTTLE_PORT, "protocol": "TCP"},
            {"name": "throttle-admin", "containerPort": THROTTLE_ADMIN_PORT, "protocol": "TCP"}
        ],
        "startupProbe": {"httpGet": {"path": "/healthz", "port": "throttle-admin"}, "periodSeconds": 1, "failureThreshold": 30},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "throttle-admin"}, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "throttle-admin"}, "periodSeconds": 5, "failureThreshold": 2},
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_port_is_a_port_the_sidecar_does_not_take() {
        assert_eq!(app_port("8080"), Ok(8080));
        for bad in ["0", "65536", "", "http", "-1", "8090", "9103", "８０"] {
            assert!(app_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_sidecar_is_probed_where_every_program_answers_readiness() {
        let sidecar = throttle_sidecar("charon:test", 8080);
        assert_eq!(sidecar["readinessProbe"]["httpGet"]["path"], "/readyz");
    }
}
