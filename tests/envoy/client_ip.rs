//! Limits per client network behind a real Envoy
//! (examples/envoy/client-ip.yaml): `masked_remote_address` masks the
//! client's address to its /24, so two addresses of one network share a
//! limit, and an address of another network has its own.

use std::fs;
use std::net::IpAddr;
use std::time::Duration;

use super::envoy_e2e::manifest_dir;
use super::token_budget::Budget;

#[tokio::test(flavor = "multi_thread")]
async fn addresses_of_one_network_share_a_limit() {
    let limits = fs::read_to_string(manifest_dir().join("examples/envoy/client-ip-limits.yaml"))
        .expect("read the example's limits")
        .replace("requests_per_unit: 100", "requests_per_unit: 2");
    let app = axum::Router::new().fallback(|| async { "answered" });
    let envoy = Budget::start_on("client-ip.yaml", &limits, &[], app, "0.25s").await;
    let from = |address: &str| {
        reqwest::Client::builder()
            .no_proxy()
            .local_address(address.parse::<IpAddr>().expect("an address"))
            .timeout(Duration::from_secs(10))
            .build()
            .expect("a client")
    };
    let route = format!("http://127.0.0.1:{}/", envoy.listen);
    let status = |client: &reqwest::Client| {
        let (client, route) = (client.clone(), route.clone());
        async move {
            client
                .get(&route)
                .send()
                .await
                .expect("Envoy answers")
                .status()
                .as_u16()
        }
    };
    // 127.0.0.1 and 127.0.0.2: one /24, two an hour between them.
    let (one, two, other) = (from("127.0.0.1"), from("127.0.0.2"), from("127.0.1.1"));
    assert_eq!(status(&one).await, 200);
    assert_eq!(status(&two).await, 200);
    assert_eq!(status(&one).await, 429, "the network's two are spent");
    assert_eq!(status(&two).await, 429);
    assert_eq!(status(&other).await, 200, "127.0.1.0/24 is another network");
}
