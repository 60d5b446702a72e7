//! Upstream's tracing variables (`TRACING_*`, OpenTelemetry's `OTEL_*`) as
//! `charon serve`'s trace flags (docs/operations.md#traces).

use crate::kit::otlp;

/// Upstream's tracing variables as serve's flags. Upstream exports over
/// OTLP/HTTP unless `TRACING_EXPORTER_PROTOCOL` says `grpc`, to the
/// endpoint the OpenTelemetry variables name, under the service
/// `RateLimit`, tracing every request by default.
pub fn serve_args(set: &dyn Fn(&str) -> Option<String>) -> Result<Vec<String>, String> {
    let mut args: Vec<String> = Vec::new();
    let protocol = match set("TRACING_EXPORTER_PROTOCOL") {
        Some(protocol) => protocol,
        None => set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .unwrap_or_else(|| "http".into()),
    };
    let flag = match protocol.to_ascii_lowercase().as_str() {
        "http" | "http/protobuf" => "--otlp-http-endpoint",
        "grpc" => "--otlp-endpoint",
        other => {
            return Err(format!(
                "TRACING_EXPORTER_PROTOCOL={other}: expected http or grpc (OTLP/HTTP JSON is not exported)"
            ));
        }
    };
    // The trace-specific variable is the full URL; the general one a base
    // that OTLP/HTTP adds `/v1/traces` to (and gRPC takes as it is).
    let endpoint = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .map(|url| (url, true))
        .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT").map(|url| (url, false)))
        .ok_or("TRACING_ENABLED=true needs OTEL_EXPORTER_OTLP_ENDPOINT")?;
    let endpoint = match (flag, endpoint) {
        ("--otlp-http-endpoint", (url, false)) => otlp::http_traces_url(&url)
            .map_err(|error| format!("OTEL_EXPORTER_OTLP_ENDPOINT={url}: {error}"))?,
        (_, (url, _)) => url,
    };
    args.push(flag.into());
    args.push(endpoint);
    args.push("--trace-service-name".into());
    args.push(set("TRACING_SERVICE_NAME").unwrap_or_else(|| "RateLimit".into()));
    for (name, flag) in [
        ("TRACING_SERVICE_NAMESPACE", "--trace-service-namespace"),
        ("TRACING_SERVICE_INSTANCE_ID", "--trace-service-instance-id"),
    ] {
        if let Some(value) = set(name) {
            args.push(flag.into());
            args.push(value);
        }
    }
    args.push("--trace-sample-ratio".into());
    args.push(set("TRACING_SAMPLING_RATE").unwrap_or_else(|| "1".into()));
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translate(vars: &[(&str, &str)]) -> Result<Vec<String>, String> {
        serve_args(&|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
                .filter(|v| !v.is_empty())
        })
    }

    #[test]
    fn envoy_gateways_tracing_is_otlp_over_http_under_its_names() {
        let args = translate(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-7d9f-x2"),
            ("TRACING_SAMPLING_RATE", "0.5"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector:4318"),
        ])
        .expect("translated")
        .join(" ");
        assert!(
            args.ends_with(
                "--otlp-http-endpoint http://otel-collector:4318/v1/traces \
                 --trace-service-name envoy-ratelimit \
                 --trace-service-namespace envoy-gateway-system \
                 --trace-service-instance-id envoy-ratelimit-7d9f-x2 \
                 --trace-sample-ratio 0.5"
            ),
            "{args}"
        );
    }

    #[test]
    fn tracing_takes_upstreams_defaults_and_its_protocol_choice() {
        let plain = translate(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ])
        .expect("translated")
        .join(" ");
        assert!(
            plain.ends_with(
                "--otlp-http-endpoint http://collector:4318/v1/traces \
                 --trace-service-name RateLimit --trace-sample-ratio 1"
            ),
            "{plain}"
        );
        for vars in [
            [("TRACING_EXPORTER_PROTOCOL", "grpc"), ("", "")],
            [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ("", "")],
            // Upstream's own variable wins over OpenTelemetry's.
            [
                ("TRACING_EXPORTER_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ],
        ] {
            let mut all = vec![
                ("TRACING_ENABLED", "true"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ];
            all.extend(vars);
            let args = translate(&all).expect("translated").join(" ");
            assert!(
                args.contains("--otlp-endpoint http://collector:4317 "),
                "{vars:?}: {args}"
            );
        }
        let full = translate(&[
            ("TRACING_ENABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://wrong:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://collector:4318/t",
            ),
        ])
        .expect("translated")
        .join(" ");
        assert!(
            full.contains("--otlp-http-endpoint http://collector:4318/t "),
            "{full}"
        );
        for (vars, named) in [
            (
                vec![
                    ("TRACING_ENABLED", "true"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("TRACING_EXPORTER_PROTOCOL", "udp"),
                ],
                "TRACING_EXPORTER_PROTOCOL",
            ),
            (
                vec![("TRACING_ENABLED", "true")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                vec![
                    ("TRACING_ENABLED", "true"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
                ],
                "https",
            ),
        ] {
            let error = translate(&vars).expect_err("refused");
            assert!(error.contains(named), "{error}");
        }
    }
}
