//! envoyproxy/ratelimit's environment variables as `charon serve`'s flags,
//! with upstream's defaults: what `charon` does when started as `ratelimit`
//! (the image's `/bin/ratelimit`, a link to `charon`), as Envoy Gateway and
//! upstream's manifests start that container
//! (docs/envoy-compatibility.md#every-upstream-variable). A variable that
//! is set but has no Charon equivalent is named in the log at start, once,
//! never ignored silently; one whose value cannot be honoured stops the
//! start, naming it.
//!
//! One piece: the translation of every upstream variable and the tests of
//! it against Envoy Gateway's and upstream's environments are read side by
//! side with upstream's settings; split, a variable would be checked in
//! two places.

mod traces;

/// `serve`'s arguments, and a note per variable set but not honoured.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translated {
    pub args: Vec<String>,
    pub notes: Vec<String>,
}

/// Upstream's variables Charon does not take, and why; named when set.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "DEBUG_HOST",
        "the debug endpoints (/rlconfig, /metrics) are on PORT",
    ),
    (
        "DEBUG_PORT",
        "the debug endpoints (/rlconfig, /metrics) are on PORT",
    ),
    (
        "USE_STATSD",
        "no statsd: Prometheus metrics are on PORT at /metrics",
    ),
    (
        "STATSD_HOST",
        "no statsd: Prometheus metrics are on PORT at /metrics",
    ),
    (
        "STATSD_PORT",
        "no statsd: Prometheus metrics are on PORT at /metrics",
    ),
    (
        "USE_DOG_STATSD",
        "no DogStatsD: Prometheus metrics are on PORT at /metrics",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE",
        "give --grpc-max-connection-age in Charon's units instead",
    ),
    ("GRPC_MAX_CONNECTION_AGE_GRACE", "not supported"),
    (
        "RUNTIME_WATCH_ROOT",
        "the configuration directory is always watched",
    ),
    (
        "RUNTIME_IGNOREDOTFILES",
        "names starting with `.` are always skipped",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "reconnects wait as XDS_CLIENT_BACKOFF_* say",
    ),
    (
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "/healthcheck is ready once the files, or the first xDS snapshot, are loaded",
    ),
    (
        "REDIS_POOL_SIZE",
        "one multiplexed connection per Redis node",
    ),
    ("REDIS_PIPELINE_WINDOW", "one script call per decision"),
    ("REDIS_PIPELINE_LIMIT", "one script call per decision"),
    ("REDIS_PERSECOND", "one store for every unit"),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "local rejections are automatic",
    ),
    ("NEAR_LIMIT_RATIO", "fixed at 80%"),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "keys expire when their window ends",
    ),
    ("EXTRA_TAGS", "add labels when scraping"),
];

/// The translation of `env` (a lookup of upstream's variables).
pub fn serve_args(env: &dyn Fn(&str) -> Option<String>) -> Result<Translated, String> {
    let mut out = Translated::default();
    let set = |name: &str| env(name).filter(|value| !value.is_empty());
    let on = |name: &str| -> Result<bool, String> {
        match set(name).as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("false" | "0" | "no" | "off") => Ok(false),
            Some("true" | "1" | "yes" | "on") => Ok(true),
            Some(other) => Err(format!("{name}={other}: expected true or false")),
        }
    };
    let mut arg = |flag: &str, value: String| {
        out.args.push(flag.to_owned());
        out.args.push(value);
    };

    match set("CONFIG_TYPE")
        .as_deref()
        .map(str::to_ascii_uppercase)
        .as_deref()
    {
        None | Some("FILE") => {}
        // The other CONFIG_GRPC_XDS_* and XDS_CLIENT_* variables are the
        // environment names of serve's --config-xds-* flags.
        Some("GRPC_XDS_SOTW") => arg(
            "--config-xds",
            set("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or_else(|| "localhost:18000".into()),
        ),
        Some(other) => {
            return Err(format!(
                "CONFIG_TYPE={other}: expected FILE or GRPC_XDS_SOTW"
            ));
        }
    }
    // Upstream reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
    let root = set("RUNTIME_ROOT").unwrap_or_else(|| "/srv/runtime_data/current".into());
    let mut config = std::path::PathBuf::from(root);
    if let Some(sub) = set("RUNTIME_SUBDIRECTORY") {
        config.push(sub);
    }
    config.push(set("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
    arg("--config", config.display().to_string());

    let address = |host: &str, port: &str, default_port: u16| -> Result<String, String> {
        let host = set(host).unwrap_or_else(|| "0.0.0.0".into());
        let port = match set(port) {
            None => default_port,
            Some(text) => text
                .parse::<u16>()
                .map_err(|_| format!("{port}={text}: expected a port number"))?,
        };
        Ok(if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        })
    };
    let admin = address("HOST", "PORT", 8080)?;
    let grpc = address("GRPC_HOST", "GRPC_PORT", 8081)?;
    arg("--admin-addr", admin);
    arg("--grpc-addr", grpc);
    if let Some(path) = set("GRPC_UDS") {
        arg("--grpc-uds", path);
    }
    if on("GRPC_SERVER_USE_TLS")? {
        for (name, flag) in [
            ("GRPC_SERVER_TLS_CERT", "--grpc-tls-cert"),
            ("GRPC_SERVER_TLS_KEY", "--grpc-tls-key"),
        ] {
            let value =
                set(name).ok_or_else(|| format!("GRPC_SERVER_USE_TLS=true needs {name}"))?;
            arg(flag, value);
        }
        // Envoy Gateway names the client CA GRPC_SERVER_TLS_CA_CERT.
        if let Some(ca) = set("GRPC_CLIENT_TLS_CACERT").or_else(|| set("GRPC_SERVER_TLS_CA_CERT")) {
            arg("--grpc-client-ca", ca);
            if let Some(san) = set("GRPC_CLIENT_TLS_SAN") {
                arg("--grpc-allowed-san", san);
            }
        }
    }

    if let Some(level) = set("LOG_LEVEL") {
        arg("--log-level", level.to_ascii_lowercase());
    }
    if let Some(format) = set("LOG_FORMAT") {
        arg("--log-format", format.to_ascii_lowercase());
    }

    match set("BACKEND_TYPE")
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("redis") => {}
        Some(other) => {
            return Err(format!(
                "BACKEND_TYPE={other}: Charon stores state in Redis (or in memory)"
            ));
        }
    }
    match set("REDIS_URL") {
        None => {
            arg("--store", "memory".into());
            out.notes.push(
                "REDIS_URL is not set: state is kept in this process (--store memory)".into(),
            );
        }
        Some(url)
            if set("REDIS_SOCKET_TYPE").map_or(url.starts_with('/'), |kind| {
                kind.eq_ignore_ascii_case("unix")
            }) =>
        {
            // Upstream's default socket type is unix; without one, a path
            // is taken as a socket and anything else as host:port.
            arg(
                "--store",
                with_auth(format!("redis+unix://{url}"), set("REDIS_AUTH"))?,
            );
        }
        Some(url) => {
            match set("REDIS_SOCKET_TYPE")
                .map(|kind| kind.to_ascii_lowercase())
                .as_deref()
            {
                None | Some("tcp") => {}
                other => {
                    return Err(format!(
                        "REDIS_SOCKET_TYPE={}: expected tcp or unix",
                        other.unwrap_or_default()
                    ));
                }
            }
            let tls = on("REDIS_TLS")?;
            let scheme = match set("REDIS_TYPE")
                .as_deref()
                .map(str::to_ascii_lowercase)
                .as_deref()
            {
                None | Some("single") => "",
                Some("sentinel") => "+sentinel",
                Some("cluster") => "+cluster",
                Some(other) => {
                    return Err(format!(
                        "REDIS_TYPE={other}: expected SINGLE, SENTINEL or CLUSTER"
                    ));
                }
            };
            let base = if tls { "rediss" } else { "redis" };
            arg(
                "--store",
                with_auth(format!("{base}{scheme}://{url}"), set("REDIS_AUTH"))?,
            );
        }
    }
    for (name, flag) in [
        ("REDIS_TLS_CACERT", "--store-ca"),
        ("REDIS_TLS_CLIENT_CERT", "--store-tls-cert"),
        ("REDIS_TLS_CLIENT_KEY", "--store-tls-key"),
        ("REDIS_TIMEOUT", "--store-timeout"),
        ("CACHE_KEY_PREFIX", "--store-key-prefix"),
        ("LIMIT_LIMIT_HEADER", "--limit-header"),
        ("LIMIT_REMAINING_HEADER", "--remaining-header"),
        ("LIMIT_RESET_HEADER", "--reset-header"),
    ] {
        if let Some(value) = set(name) {
            arg(flag, value);
        }
    }
    for (name, flag) in [
        ("MERGE_DOMAIN_CONFIG", "--merge-domain-config"),
        ("SHADOW_MODE", "--shadow-mode"),
        ("QUOTA_MODE", "--quota-mode"),
        ("RESPONSE_DYNAMIC_METADATA", "--response-dynamic-metadata"),
    ] {
        if on(name)? {
            out.args.push(flag.to_owned());
        }
    }
    if on("LIMIT_RESPONSE_HEADERS_ENABLED")? {
        out.args.push("--response-headers".into());
        out.args.push("ratelimit".into());
    }
    // Upstream counts every hit unless told to stop when over.
    if !on("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")? {
        out.args.push("--count-rejected-hits".into());
    }
    // Upstream's default PROMETHEUS_ADDR is :9090; metrics are also on PORT.
    // Its series, with its names and meaning, beside Charon's own
    // (docs/envoy-compatibility.md#metrics).
    if on("USE_PROMETHEUS")? {
        let addr = set("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
        let addr = match addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => addr,
        };
        if addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "PROMETHEUS_ADDR={addr}: expected HOST:PORT or :PORT"
            ));
        }
        out.args.push("--metrics-addr".into());
        out.args.push(addr);
        if let Some(path) = set("PROMETHEUS_PATH") {
            if !path.starts_with('/') {
                return Err(format!(
                    "PROMETHEUS_PATH={path}: expected a path such as /metrics"
                ));
            }
            out.args.push("--metrics-path".into());
            out.args.push(path);
        }
        out.args.push("--upstream-metrics".into());
        if let Some(mapper) = set("PROMETHEUS_MAPPER_YAML") {
            out.args.push("--upstream-metrics-mapper".into());
            out.args.push(mapper);
        } else if on("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")? {
            out.args.push("--upstream-response-time-ms".into());
        }
    } else {
        for name in [
            "PROMETHEUS_ADDR",
            "PROMETHEUS_PATH",
            "PROMETHEUS_MAPPER_YAML",
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        ] {
            if set(name).is_some() {
                out.notes.push(format!(
                    "{name} is set but USE_PROMETHEUS is not true: Charon's metrics are on PORT at /metrics"
                ));
            }
        }
    }
    if on("TRACING_ENABLED")? {
        out.args.extend(traces::serve_args(&set)?);
    }
    for (name, why) in UNSUPPORTED {
        if set(name).is_some() {
            out.notes.push(format!("{name} is set but not used: {why}"));
        }
    }
    Ok(out)
}

/// `store` with upstream's `REDIS_AUTH` (`password` or `user:password`)
/// written into it.
fn with_auth(store: String, auth: Option<String>) -> Result<String, String> {
    let Some(auth) = auth else {
        return Ok(store);
    };
    let (user, password) = match auth.split_once(':') {
        Some((user, password)) => (Some(user), password),
        None => (None, auth.as_str()),
    };
    crate::store::redis::url::with_credentials(&store, user, password)
        .map_err(|error| format!("REDIS_URL with REDIS_AUTH: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translate(vars: &[(&str, &str)]) -> Result<Translated, String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        serve_args(&|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn envoy_gateways_environment_becomes_serves_flags() {
        let translated = translate(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("CONFIG_TYPE", "FILE"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.default:6379"),
            ("REDIS_AUTH", "user:p@ss"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ])
        .expect("translated");
        assert_eq!(
            translated.args,
            [
                "--config",
                "/data/ratelimit/config",
                "--admin-addr",
                "0.0.0.0:8080",
                "--grpc-addr",
                "0.0.0.0:8081",
                "--grpc-tls-cert",
                "/certs/tls.crt",
                "--grpc-tls-key",
                "/certs/tls.key",
                "--grpc-client-ca",
                "/certs/ca.crt",
                "--log-level",
                "info",
                "--store",
                "redis://user:p%40ss@redis.default:6379",
                "--count-rejected-hits",
                "--metrics-addr",
                "0.0.0.0:19001",
                "--upstream-metrics",
                "--upstream-metrics-mapper",
                "/etc/statsd-exporter/conf.yaml",
            ]
        );
        assert_eq!(translated.notes.len(), 3, "{:?}", translated.notes);
        assert!(
            translated
                .notes
                .iter()
                .any(|n| n.starts_with("USE_STATSD is set"))
        );
    }

    #[test]
    fn upstreams_prometheus_variables_become_the_metrics_flags() {
        let translated = translate(&[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_PATH", "/stats/prometheus"),
            ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
        ])
        .expect("translated");
        assert!(
            translated.args.join(" ").ends_with(
                "--metrics-addr 0.0.0.0:9090 --metrics-path /stats/prometheus --upstream-metrics --upstream-response-time-ms"
            ),
            "{:?}",
            translated.args
        );
        let off = translate(&[("PROMETHEUS_MAPPER_YAML", "/etc/m.yaml")]).expect("translated");
        assert!(!off.args.contains(&"--upstream-metrics".to_owned()));
        assert!(
            off.notes
                .iter()
                .any(|n| n.starts_with("PROMETHEUS_MAPPER_YAML is set but USE_PROMETHEUS")),
            "{:?}",
            off.notes
        );
    }

    #[test]
    fn values_that_cannot_be_honoured_stop_the_start_by_name() {
        for (vars, named) in [
            (vec![("CONFIG_TYPE", "GRPC_XDS_DELTA")], "CONFIG_TYPE"),
            (
                vec![("REDIS_URL", "r:6379"), ("REDIS_SOCKET_TYPE", "udp")],
                "REDIS_SOCKET_TYPE",
            ),
            (vec![("PORT", "http")], "PORT"),
            (
                vec![("REDIS_URL", "r:6379"), ("REDIS_TLS", "maybe")],
                "REDIS_TLS",
            ),
            (
                vec![("GRPC_SERVER_USE_TLS", "true")],
                "GRPC_SERVER_TLS_CERT",
            ),
            (vec![("BACKEND_TYPE", "memcache")], "BACKEND_TYPE"),
        ] {
            let error = translate(&vars).expect_err("refused");
            assert!(error.contains(named), "{error}");
        }
    }

    #[test]
    fn xds_and_a_unix_socket_as_envoy_gateway_and_upstream_give_them() {
        let translated = translate(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
            ("REDIS_AUTH", "p@ss"),
        ])
        .expect("translated");
        let args = translated.args.join(" ");
        assert!(
            args.starts_with("--config-xds envoy-gateway:18001 --config "),
            "{args}"
        );
        assert!(
            args.contains("--store redis+unix:///var/run/nutcracker/ratelimit.sock?pass=p%40ss"),
            "{args}"
        );
        // Read by serve's flags from the environment, so not a note.
        assert!(
            !translated
                .notes
                .iter()
                .any(|note| note.contains("FORCE_START")),
            "{:?}",
            translated.notes
        );
        let tcp = translate(&[("REDIS_URL", "redis:6379"), ("REDIS_SOCKET_TYPE", "unix")])
            .expect("translated");
        assert!(tcp.args.contains(&"redis+unix://redis:6379".to_owned()));
    }

    #[test]
    fn upstreams_defaults_without_any_variable() {
        let translated = translate(&[]).expect("translated");
        assert_eq!(
            translated.args,
            [
                "--config",
                "/srv/runtime_data/current/config",
                "--admin-addr",
                "0.0.0.0:8080",
                "--grpc-addr",
                "0.0.0.0:8081",
                "--store",
                "memory",
                "--count-rejected-hits",
            ]
        );
        let stop =
            translate(&[("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")]).expect("translated");
        assert!(!stop.args.contains(&"--count-rejected-hits".to_owned()));
    }
}
