//! The webhook's decisions, one pod at a time.

use super::*;

fn pod_review(annotations: Value, spec: Value) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "object": {"metadata": {"name": "p", "annotations": annotations}, "spec": spec}
        }
    })
    .to_string()
    .into_bytes()
}

fn patch_of(verdict: &Verdict) -> Value {
    let encoded = verdict.response["response"]["patch"].as_str().unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn an_opted_in_pod_gets_the_sidecar_and_its_config() {
    let body = pod_review(
        json!({INJECT: "true", CONFIG: "shop-limits"}),
        json!({"containers": [{"name": "app", "image": "app"}], "initContainers": [{"name": "migrate", "image": "m"}]}),
    );
    let verdict = review(&body, &SidecarTemplate::default()).unwrap();
    assert!(verdict.patched, "{}", verdict.reason);
    assert_eq!(verdict.response["response"]["allowed"], json!(true));
    let patch = patch_of(&verdict);
    assert_eq!(patch[0]["path"], json!("/spec/initContainers/0"));
    assert_eq!(patch[0]["value"]["restartPolicy"], json!("Always"));
    assert_eq!(
        patch[1]["value"],
        json!([{"name": "charon-config", "configMap": {"name": "shop-limits"}}])
    );
    assert_eq!(
        patch[2]["path"],
        json!("/metadata/annotations/charon.io~1injected")
    );
}

#[test]
fn a_throttled_pod_gets_the_throttling_sidecar_in_front_of_its_port() {
    let body = pod_review(
        json!({INJECT: "true", THROTTLE: "8080"}),
        json!({"containers": [{"name": "app", "image": "app"}], "initContainers": [{"name": "migrate", "image": "m"}]}),
    );
    let verdict = review(&body, &SidecarTemplate::default()).unwrap();
    assert!(verdict.patched, "{}", verdict.reason);
    let patch = patch_of(&verdict);
    assert_eq!(patch[0]["path"], json!("/spec/initContainers/0"));
    assert_eq!(patch[0]["value"]["name"], json!(SIDECAR));
    assert_eq!(patch[1]["path"], json!("/spec/initContainers/1"));
    assert_eq!(
        patch[1]["value"],
        throttle::throttle_sidecar(super::IMAGE, 8080)
    );
    // A port that is none, or the sidecar's own: left alone, with why.
    for bad in ["http", "8090", "0"] {
        let body = pod_review(
            json!({INJECT: "true", THROTTLE: bad}),
            json!({"containers": [{"name": "app", "image": "app"}]}),
        );
        let verdict = review(&body, &SidecarTemplate::default()).unwrap();
        assert!(!verdict.patched, "{bad}");
        assert!(verdict.reason.contains(THROTTLE), "{}", verdict.reason);
    }
}

#[test]
fn an_admin_token_secret_is_mounted_and_named_to_the_sidecar() {
    let body = pod_review(
        json!({INJECT: "true", ADMIN_TOKEN_SECRET: "charon-admin"}),
        json!({"containers": [{"name": "app", "image": "app"}]}),
    );
    let verdict = review(&body, &SidecarTemplate::default()).unwrap();
    assert!(verdict.patched, "{}", verdict.reason);
    let patch = patch_of(&verdict);
    let args = patch[0]["value"][0]["args"].as_array().unwrap();
    let at = args.iter().position(|a| a == "--admin-token-file").unwrap();
    assert_eq!(args[at + 1], json!("/etc/charon-admin/token"));
    assert_eq!(
        patch[1]["value"][1],
        json!({"name": "charon-admin-token",
               "secret": {"secretName": "charon-admin", "items": [{"key": "token", "path": "token"}]}})
    );
    let mtls = pod_review(
        json!({INJECT: "true", GRPC_TLS_SECRET: "charon-tls", GRPC_CLIENT_CA_SECRET: "envoy-ca"}),
        json!({"containers": [{"name": "app"}]}),
    );
    let patch = patch_of(&review(&mtls, &SidecarTemplate::default()).unwrap());
    let args = patch[0]["value"][0]["args"].as_array().unwrap();
    for (flag, file) in [
        ("--grpc-tls-cert", "/etc/charon-tls/tls.crt"),
        ("--grpc-tls-key", "/etc/charon-tls/tls.key"),
        ("--grpc-client-ca", "/etc/charon-client-ca/ca.crt"),
    ] {
        let at = args.iter().position(|a| a == flag).unwrap();
        assert_eq!(args[at + 1], json!(file));
    }
    let ca_alone = pod_review(
        json!({INJECT: "true", GRPC_CLIENT_CA_SECRET: "envoy-ca"}),
        json!({"containers": [{"name": "app"}]}),
    );
    let verdict = review(&ca_alone, &SidecarTemplate::default()).unwrap();
    assert!(!verdict.patched && verdict.reason.contains("needs"));
    let bad = pod_review(
        json!({INJECT: "true", ADMIN_TOKEN_SECRET: "Not_A_Name"}),
        json!({"containers": [{"name": "app"}]}),
    );
    let verdict = review(&bad, &SidecarTemplate::default()).unwrap();
    assert!(!verdict.patched);
    assert!(verdict.reason.contains("not a valid Secret name"));
}

#[test]
fn anything_else_is_admitted_unchanged_with_a_reason() {
    let template = SidecarTemplate::default();
    let app = json!({"containers": [{"name": "app"}]});
    for (annotations, spec, why) in [
        (json!({}), app.clone(), "no charon.io/inject"),
        (json!({INJECT: "false"}), app.clone(), "\"false\""),
        (json!({INJECT: "yes"}), app.clone(), "only \"true\""),
        (
            json!({INJECT: "true"}),
            json!({"containers": []}),
            "no containers",
        ),
        (json!({INJECT: "true"}), json!({}), "no containers"),
        (
            json!({INJECT: "true"}),
            json!({"containers": [{"name": "app"}], "initContainers": [{"name": "charon"}]}),
            "already",
        ),
        (
            json!({INJECT: "true", CONFIG: "Bad_Name"}),
            app.clone(),
            "not a valid ConfigMap",
        ),
        (
            json!({INJECT: "true", STORE: "mysql://u:secret@db"}),
            app.clone(),
            "not `memory`",
        ),
    ] {
        let verdict = review(&pod_review(annotations, spec), &template).unwrap();
        assert!(!verdict.patched);
        assert!(verdict.reason.contains(why), "{} / {why}", verdict.reason);
        assert!(!verdict.reason.contains("secret"));
        assert_eq!(
            verdict.response["response"],
            json!({"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": true})
        );
    }
    assert!(matches!(
        review(b"{", &template),
        Err(ReviewError::NotJson(_))
    ));
    assert_eq!(review(b"{}", &template), Err(ReviewError::NotAReview));
    assert_eq!(
        review(br#"{"request": {"uid": ""}}"#, &template),
        Err(ReviewError::NotAReview)
    );
}
