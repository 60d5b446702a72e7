//! The xDS client's unit tests: responses refused with their reason, the
//! backoff's waits.

use super::*;
use envoy_types::pb::google::protobuf::Any;

fn resource(name: &str, domain: &str) -> Any {
    Any {
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        value: RateLimitConfig {
            name: name.into(),
            domain: domain.into(),
            descriptors: Vec::new(),
        }
        .encode_to_vec(),
    }
}

fn response(resources: Vec<Any>) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: "1".into(),
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        nonce: "n".into(),
        resources,
        ..Default::default()
    }
}

#[test]
fn a_response_is_refused_naming_the_resource_and_the_reason() {
    let wrong_type = Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        value: Vec::new(),
    };
    let garbage = Any {
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        value: vec![0xff, 0xff, 0xff],
    };
    for (response, max, expected) in [
        (
            response(vec![resource("a", "d"), wrong_type]),
            1 << 20,
            "resource #1 is a `type.googleapis.com/envoy.config.cluster.v3.Cluster`",
        ),
        (
            response(vec![garbage]),
            1 << 20,
            "resource #0 does not decode",
        ),
        (
            response(vec![resource("a", "d"), resource("b", "d")]),
            1 << 20,
            "resources `a` and `b` both configure domain `d`",
        ),
        (
            response(vec![resource("a", "d")]),
            10,
            "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        ),
        (
            DiscoveryResponse {
                type_url: "type.googleapis.com/x".into(),
                ..response(Vec::new())
            },
            1 << 20,
            "of type `type.googleapis.com/x`",
        ),
    ] {
        let reason = pushed_namespaces(&response, max, &extensions::Extensions::default())
            .expect_err("refused");
        assert!(reason.contains(expected), "`{expected}` in {reason}");
    }
    let fine = pushed_namespaces(
        &response(vec![resource("a", "d"), resource("", "e")]),
        1 << 20,
        &extensions::Extensions::default(),
    )
    .expect("two domains");
    assert_eq!(fine[0].origin, PathBuf::from("xds:a"));
    assert_eq!(fine[1].origin, PathBuf::from("xds:#1"));
}

#[test]
fn backoff_doubles_to_its_cap_within_its_spread() {
    let backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
        random_factor: 0.5,
        jitter: false,
    };
    let waits: Vec<u128> = (1..=6).map(|n| backoff.wait(n, 0.0).as_millis()).collect();
    assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
    let jittered = Backoff {
        jitter: true,
        ..backoff
    };
    assert_eq!(jittered.wait(1, 0.0).as_millis(), 50);
    assert_eq!(jittered.wait(1, 0.5).as_millis(), 100);
    assert_eq!(jittered.wait(u32::MAX, 0.999_999).as_millis(), 1499);
}
