use super::*;

fn key(text: &str) -> Arc<str> {
    Arc::from(text)
}

fn encoded(metrics: &UpstreamMetrics, openmetrics: bool) -> String {
    let mut out = String::new();
    metrics.encode(&Config::default(), openmetrics, &mut out);
    out
}

#[test]
fn counters_are_bare_names_in_the_classic_format_and_unknown_in_openmetrics() {
    let metrics = UpstreamMetrics::new(&Mapper::default_with(false));
    metrics.count(
        &key("gw.route_route.masked_remote_address_0.0.0.0/0"),
        split(10, 9, 4, true, false),
    );
    let classic = encoded(&metrics, false);
    for line in [
        "# TYPE ratelimit_service_rate_limit_over_limit counter",
        "ratelimit_service_rate_limit_total_hits{domain=\"gw\",key1=\"route_route\",key2=\"masked_remote_address_0_0_0_0/0\"} 4",
        "ratelimit_service_rate_limit_over_limit{domain=\"gw\",key1=\"route_route\",key2=\"masked_remote_address_0_0_0_0/0\"} 3",
        "ratelimit_service_rate_limit_near_limit{domain=\"gw\",key1=\"route_route\",key2=\"masked_remote_address_0_0_0_0/0\"} 1",
        "# TYPE charon_upstream_series_folded_total counter",
    ] {
        assert!(classic.lines().any(|l| l == line), "{line} in\n{classic}");
    }
    // Nothing within the limit yet: no series, as statsd_exporter has none.
    assert!(!classic.contains("within_limit"), "{classic}");
    let openmetrics = encoded(&metrics, true);
    assert!(openmetrics.contains("# TYPE ratelimit_service_rate_limit_over_limit unknown"));
    assert!(openmetrics.contains("# TYPE charon_upstream_series_folded counter"));
    assert!(!openmetrics.contains("over_limit_total"));
}

#[test]
fn the_response_time_follows_the_mappers_scale() {
    for (mapper, sum, at_10ms) in [
        // 7 ms is in the 0.01 bucket; 20 s past the last.
        (Mapper::default_with(false), "20.007", ("0.01", 1)),
        // Envoy Gateway's copy: milliseconds under the `_seconds` name, so
        // 7 is in the bucket of 10 and 20 000 past it.
        (Mapper::default_with(true), "20007", ("10", 1)),
    ] {
        let metrics = UpstreamMetrics::new(&mapper);
        metrics.request(Duration::from_micros(7_900));
        metrics.request(Duration::from_secs(20));
        let text = encoded(&metrics, false);
        let line = |suffix: &str| format!("ratelimit_service_response_time_seconds{suffix}");
        for expected in [
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 2".to_owned(),
            line(&format!("_sum{{grpc_method=\"ShouldRateLimit\"}} {sum}")),
            line("_bucket{grpc_method=\"ShouldRateLimit\",le=\"0.005\"} 0"),
            line(&format!(
                "_bucket{{grpc_method=\"ShouldRateLimit\",le=\"{}\"}} {}",
                at_10ms.0, at_10ms.1
            )),
            line("_bucket{grpc_method=\"ShouldRateLimit\",le=\"10\"} 1"),
            line("_bucket{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"} 2"),
            line("_count{grpc_method=\"ShouldRateLimit\"} 2"),
        ] {
            assert!(text.lines().any(|l| l == expected), "{expected} in\n{text}");
        }
    }
}

#[test]
fn label_sets_past_the_cap_count_in_one_overflow_series() {
    let metrics = UpstreamMetrics::new(&Mapper::default_with(false));
    let one = split(100, 0, 1, false, false);
    for n in 0..MAX_UPSTREAM_SERIES {
        metrics.count(&key(&format!("d.k_{n}")), one);
    }
    metrics.count(&key("d.k_0"), one);
    metrics.count(&key("d.late"), one);
    metrics.count(&key("d.later"), one);
    let text = encoded(&metrics, false);
    assert!(text.contains("ratelimit_service_rate_limit_total_hits{domain=\"d\",key1=\"k_0\"} 2"));
    assert!(text.contains(
        "ratelimit_service_rate_limit_total_hits{domain=\"overflow\",key1=\"overflow\"} 2"
    ));
    assert!(!text.contains("late"));
    assert!(text.contains("charon_upstream_series_folded_total 2"));
}

#[test]
fn errors_loads_and_global_shadow_mode_are_counted() {
    let metrics = UpstreamMetrics::new(&Mapper::default_with(false));
    assert!(!encoded(&metrics, false).contains("ratelimit_service_config_load_success"));
    metrics.error(ErrorType::Redis);
    metrics.config_load(true);
    metrics.config_load(false);
    metrics.global_shadow();
    let text = encoded(&metrics, false);
    for line in [
        "ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"} 1",
        "ratelimit_service_config_load_success 1",
        "ratelimit_service_config_load_error 1",
        "ratelimit_service_global_shadow_mode 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(!text.contains("service_error"));
}

#[test]
fn keys_past_the_ones_remembered_still_count_in_their_series() {
    let metrics = UpstreamMetrics::new(&Mapper::default_with(false));
    let one = split(100, 0, 1, false, false);
    // detailed_metric's keys: each request's value below the third level,
    // every one folded into the same series.
    let keys = MAX_KEYS + 10;
    for n in 0..keys {
        metrics.count(&key(&format!("d.route.rule.user_{n}")), one);
    }
    let text = encoded(&metrics, false);
    assert!(text.contains(&format!(
        "ratelimit_service_rate_limit_total_hits{{domain=\"d\",key1=\"route\",key2=\"rule\"}} {keys}"
    )));
    assert!(text.contains("charon_upstream_series_folded_total 0"));
}

#[test]
fn a_refund_counts_its_hits_as_negative_and_nothing_else() {
    let metrics = UpstreamMetrics::new(&Mapper::default_with(false));
    let limit = key("gw.route_route");
    metrics.count(&limit, split(10, 0, 4, false, false));
    metrics.count(
        &limit,
        Split {
            total_negative_hits: 3,
            ..Split::default()
        },
    );
    let text = encoded(&metrics, false);
    for line in [
        "ratelimit_service_rate_limit_total_hits{domain=\"gw\",key1=\"route_route\"} 4",
        "ratelimit_service_rate_limit_within_limit{domain=\"gw\",key1=\"route_route\"} 4",
        "ratelimit_service_rate_limit_total_negative_hits{domain=\"gw\",key1=\"route_route\"} 3",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
}
