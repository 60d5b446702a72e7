//! `examples/tonic.rs` does what its doc comment says: with gRPC reflection
//! served (so `grpcurl` needs no proto files) and not limited, six
//! `grpcurl -plaintext -H 'x-tenant-id: acme' localhost:PORT
//! grpc.health.v1.Health/Check` calls give five answers, then
//! `RESOURCE_EXHAUSTED`. Each call here is what grpcurl sends: reflection
//! requests for the method's descriptor, then the call, all with the header.
//!
//! The example's binary is built by `cargo build --examples`, which
//! `scripts/test.sh` runs before the tests (`cargo test --all-targets` builds
//! examples as test harnesses, not as the program).

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::KilledOnDrop;
use tonic::Request;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

fn with_tenant<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("x-tenant-id", MetadataValue::from_static("acme"));
    request
}

/// What `grpcurl` asks reflection before calling a method: the file that
/// defines the service.
async fn reflect(channel: Channel) -> Result<(), tonic::Status> {
    let mut reflection = ServerReflectionClient::new(channel);
    let asks = tokio_stream::iter([ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "grpc.health.v1.Health".into(),
        )),
    }]);
    let mut answers = reflection
        .server_reflection_info(with_tenant(asks))
        .await?
        .into_inner();
    let answer = answers.message().await?.expect("an answer");
    match answer.message_response {
        Some(MessageResponse::FileDescriptorResponse(files))
            if !files.file_descriptor_proto.is_empty() =>
        {
            Ok(())
        }
        other => panic!("the health service's descriptors: {other:?}"),
    }
}

#[tokio::test]
async fn grpcurl_as_the_doc_comment_says() {
    let port = support::redis::free_port();
    let _example = KilledOnDrop(
        Command::new(support::example_binary("tonic"))
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the example starts"),
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let channel = loop {
        match Channel::from_shared(url.clone())
            .expect("a URL")
            .connect()
            .await
        {
            Ok(channel) => break channel,
            Err(error) => {
                assert!(Instant::now() < deadline, "the example listens: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let mut answers = Vec::new();
    for _ in 0..6 {
        reflect(channel.clone())
            .await
            .expect("reflection is not limited");
        let call = HealthClient::new(channel.clone())
            .check(with_tenant(HealthCheckRequest {
                service: String::new(),
            }))
            .await;
        answers.push(call.map(|_| ()).map_err(|status| status.code()));
    }
    assert_eq!(
        answers,
        [
            Ok(()),
            Ok(()),
            Ok(()),
            Ok(()),
            Ok(()),
            Err(tonic::Code::ResourceExhausted)
        ]
    );
}
