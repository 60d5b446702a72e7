//! A real Prometheus server (Debian's `prometheus`, which
//! `scripts/test-deps.sh` installs), started on a free port with a scrape
//! configuration of the test's, and asked through its HTTP query API.
//! `$CHARON_PROMETHEUS` names another binary. As with Envoy and Redis, a
//! test that needs it fails, never skips, when it is missing, saying how to
//! install it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::KilledOnDrop;

/// The Prometheus binary: `$CHARON_PROMETHEUS`, else `prometheus` on the
/// `PATH`; panics, saying how to get one, when there is none.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CHARON_PROMETHEUS") {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("prometheus"))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "no prometheus binary (CHARON_PROMETHEUS, else `prometheus` on PATH): \
             run `bash scripts/test-deps.sh`, which installs Debian's package"
        )
    })
}

/// A running Prometheus, killed (by its PID) when dropped.
pub struct Prometheus {
    pub port: u16,
    _process: KilledOnDrop,
    http: reqwest::Client,
    log: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus in `dir` on `port`, scraping `target`
    /// (`host:port`) at `path` every second, each series labelled `labels`
    /// (what Kubernetes service discovery would add); waits until it is
    /// ready.
    pub async fn start(dir: &Path, port: u16, target: &str, labels: &[(&str, &str)]) -> Self {
        let labels: String = labels
            .iter()
            .map(|(name, value)| format!("          {name}: \"{value}\"\n"))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ratelimit\n    scrape_interval: 1s\n    scrape_timeout: 1s\n    static_configs:\n      - targets: [\"{target}\"]\n        labels:\n{labels}"
        );
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).expect("prometheus.yml written");
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = Command::new(binary())
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("prometheus starts");
        let prometheus = Self {
            port,
            _process: KilledOnDrop(child),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("reqwest client"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = prometheus
                .http
                .get(format!("http://127.0.0.1:{port}/-/ready"))
                .send()
                .await
                .is_ok_and(|reply| reply.status().is_success());
            if ready {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus is not ready after 30 s:\n{}",
                prometheus.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An instant query's result: each series' labels and value, or what
    /// went wrong.
    pub async fn query(&self, expr: &str) -> Result<Vec<(serde_json::Value, String)>, String> {
        let reply = self
            .http
            .get(format!("http://127.0.0.1:{}/api/v1/query", self.port))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|error| error.to_string())?;
        let text = reply.text().await.map_err(|error| error.to_string())?;
        let body: serde_json::Value =
            serde_json::from_str(&text).map_err(|error| format!("{error}: {text}"))?;
        if body["status"] != "success" {
            return Err(format!("{expr}: {body}"));
        }
        let series = body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(series
            .into_iter()
            .map(|one| {
                let value = one["value"][1].as_str().unwrap_or_default().to_owned();
                (one["metric"].clone(), value)
            })
            .collect())
    }

    /// The targets' scrape health, as the API says it.
    pub async fn targets(&self) -> String {
        match self
            .http
            .get(format!("http://127.0.0.1:{}/api/v1/targets", self.port))
            .send()
            .await
        {
            Ok(reply) => reply.text().await.unwrap_or_default(),
            Err(error) => error.to_string(),
        }
    }
}
