//! A scrape's answer, the one of every program's metrics endpoint: the
//! classic Prometheus format (`text/plain; version=0.0.4`) unless the
//! scraper's `Accept` prefers OpenMetrics: a plain `curl /metrics`, or Envoy
//! Gateway's e2e helper, reads counters under the names envoyproxy/ratelimit
//! serves them (docs/operations.md#metrics). The registry writes
//! OpenMetrics; the classic text is made from it line by line, so the
//! sample names (`charon_…_total`) are the same in both.

/// The classic format's content type.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";
/// OpenMetrics' content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A scrape's `Accept` header, what [`render`] chooses the format by.
pub fn accept(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::ACCEPT)
        .and_then(|value| value.to_str().ok())
}

/// Whether `accept` (the request's header, if any) ranks OpenMetrics above
/// the classic text format.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    let (mut openmetrics, mut classic) = (0.0_f64, 0.0_f64);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let kind = parts.next().unwrap_or("").to_ascii_lowercase();
        let quality = parts
            .filter_map(|param| param.strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f64>().ok())
            .unwrap_or(1.0);
        match kind.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
            "text/plain" | "text/*" | "*/*" => classic = classic.max(quality),
            _ => {}
        }
    }
    openmetrics > 0.0 && openmetrics >= classic
}

/// The registries' series, then what `extra` writes in the chosen format
/// (`true`: OpenMetrics), as a content type and a body: the one answer of
/// every metrics endpoint.
pub fn render(
    registries: &[&prometheus_client::registry::Registry],
    accept: Option<&str>,
    extra: impl FnOnce(bool, &mut String),
) -> (&'static str, String) {
    let openmetrics = wants_openmetrics(accept);
    let mut text = String::new();
    for registry in registries {
        let mut one = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut one, registry) {
            tracing::warn!(%error, "cannot encode metrics");
        }
        text.push_str(one.strip_suffix("# EOF\n").unwrap_or(&one));
    }
    let mut text = if openmetrics { text } else { to_classic(&text) };
    extra(openmetrics, &mut text);
    if openmetrics {
        text.push_str("# EOF\n");
        (OPENMETRICS, text)
    } else {
        (CLASSIC, text)
    }
}

/// prometheus-client's OpenMetrics text in the classic format: a
/// counter's family is named as its `_total` samples are, `unknown` is
/// `untyped`, `# UNIT` and `# EOF` go.
pub fn to_classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut lines = openmetrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // The family's type comes on a later line: look ahead.
            let counter = lines
                .clone()
                .find_map(|next| next.strip_prefix("# TYPE "))
                .is_some_and(|typed| typed == format!("{name} counter"));
            let name = if counter {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            out.push_str("# HELP ");
            out.push_str(&name);
            out.push(' ');
            out.push_str(&help.replace("\\\"", "\""));
            out.push('\n');
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "unknown" => (name.to_owned(), "untyped"),
                "info" => (format!("{name}_info"), "gauge"),
                other => (name.to_owned(), other),
            };
            out.push_str("# TYPE ");
            out.push_str(&name);
            out.push(' ');
            out.push_str(kind);
            out.push('\n');
            continue;
        }
        // A sample: without its exemplar, which the classic format lacks.
        let sample = line.split_once(" # ").map_or(line, |(sample, _)| sample);
        out.push_str(sample);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_preferred() {
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        // Prometheus 2's scrape header.
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(!wants_openmetrics(Some(
            "application/openmetrics-text;q=0.3,text/plain;q=0.5"
        )));
    }

    #[test]
    fn the_classic_text_keeps_the_sample_names() {
        let openmetrics = "# HELP charon_decisions ShouldRateLimit \\\"answers\\\".\n# TYPE charon_decisions counter\ncharon_decisions_total{namespace=\"edge\",result=\"ok\"} 3\n# HELP charon_sessions Open sessions.\n# TYPE charon_sessions gauge\n# UNIT charon_sessions sessions\ncharon_sessions 2\n# EOF\n";
        assert_eq!(
            to_classic(openmetrics),
            "# HELP charon_decisions_total ShouldRateLimit \"answers\".\n# TYPE charon_decisions_total counter\ncharon_decisions_total{namespace=\"edge\",result=\"ok\"} 3\n# HELP charon_sessions Open sessions.\n# TYPE charon_sessions gauge\ncharon_sessions 2\n"
        );
    }
}
