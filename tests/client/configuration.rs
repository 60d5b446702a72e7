//! The configuration API on the embedded engine
//! (docs/configuration-api.md): an engine opened on files takes per-domain
//! overrides in process, checked like a file and applied whole; on Redis it
//! shares the log with the sidecars, so a change made through a sidecar's
//! admin port applies to the embedded engine too.
#![cfg(feature = "server")]

use crate::support;

use std::time::Duration;

use charon::client::{Client, Embedded};
use charon::config::LoadOptions;
use charon::service::configuration::WriteError;
use charon::store::config_log::{Expect, ObjectPath, Write};
use charon::store::copies::CopyTimings;
use charon::store::open::StoreOptions;
use support::redis::RedisServer;
use support::sidecar::{Sidecar, eventually, tempdir, write_config};

const CONFIG: &str = "
domain: shop
resources:
  api:
    rate:
      tiers:
        - {limit: 2, window: 1h, active: forever}
";

/// How many of 8 requests for `domain` `client` grants.
async fn granted(client: &Client, domain: &str) -> u64 {
    let mut granted = 0;
    for _ in 0..8 {
        granted += client
            .request("shop", "api", domain)
            .await
            .expect("answered")
            .granted;
    }
    granted
}

fn vip_override(body: &str) -> Write {
    Write {
        path: ObjectPath::Override {
            namespace: "shop".into(),
            resource: "api".into(),
            domain: "vip".into(),
        },
        body: Some(body.into()),
        expect: Expect::Any,
        who: "the test".into(),
    }
}

#[tokio::test]
async fn an_embedded_engine_takes_overrides_in_process() {
    let dir = tempdir();
    let path = write_config(dir.path(), CONFIG);
    let embedded = Embedded::open_files(
        &path,
        LoadOptions::default(),
        &StoreOptions::default(),
        CopyTimings::default(),
        None,
    )
    .await
    .expect("the engine opens on the files");
    let configuration = embedded
        .configuration()
        .cloned()
        .expect("an engine on files has the configuration API");
    let client = Client::new(embedded);
    assert_eq!(granted(&client, "plain").await, 2);

    // A bad body is refused with its place, and changes nothing.
    let refused = configuration
        .write(
            vip_override(r#"{"tiers": [{"limit": -5, "window": "1h"}]}"#),
            false,
        )
        .await;
    assert!(
        matches!(refused, Err(WriteError::Invalid(_))),
        "{refused:?}"
    );
    let written = configuration
        .write(
            vip_override(r#"{"tiers": [{"limit": 5, "window": "1h"}]}"#),
            false,
        )
        .await
        .expect("a valid override is written");
    assert_eq!(written.change.map(|change| change.version), Some(1));
    assert_eq!(granted(&client, "vip").await, 5);
    assert_eq!(granted(&client, "other").await, 2);
}

#[tokio::test]
async fn an_embedded_engine_on_redis_follows_a_sidecars_configuration_api() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let path = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &path, &redis.url(), &[]);
    sidecar.wait_serving().await;
    let embedded = Embedded::open_files(
        &path,
        LoadOptions::default(),
        &StoreOptions {
            url: redis.url(),
            timeout: Duration::from_secs(2),
            ..StoreOptions::default()
        },
        CopyTimings::default(),
        None,
    )
    .await
    .expect("the engine opens on Redis");
    let client = Client::new(embedded);
    let status = sidecar
        .put_admin(
            "/v1/namespaces/shop/resources/api/domains/vip",
            r#"{"tiers": [{"limit": 5, "window": "1h"}]}"#,
        )
        .await;
    assert_eq!(status, 200);
    // The engine polls the shared log, as every sidecar does.
    eventually(
        "vip's limit is 5 here",
        Duration::from_secs(5),
        async || {
            let answer = client
                .request("shop", "api", "vip")
                .await
                .map_err(|error| error.to_string())?;
            if answer.context.tier_limit == 5 {
                Ok(())
            } else {
                Err(format!("tier limit {}", answer.context.tier_limit))
            }
        },
    )
    .await;
}
