//! The `process_*` series every metrics endpoint serves (`charon serve`,
//! `charon throttle`, `charon inject`), named and measured as the
//! Prometheus client libraries' process collectors do, read from `/proc`
//! at each scrape: resident and virtual memory, CPU seconds, open and
//! maximum descriptors, the start time. A small reader of four files: the
//! `procfs` crate would bring a dependency tree for six numbers. Off
//! Linux, or when `/proc` cannot be read, the series are left out.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// One reading of the process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Process {
    pub resident_memory_bytes: u64,
    pub virtual_memory_bytes: u64,
    pub cpu_seconds: f64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
    pub start_time_seconds: f64,
}

impl Process {
    /// This process, now; `None` where `/proc` does not say.
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        // SAFETY: sysconf only reads a constant of the system.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let ticks = u64::try_from(ticks).ok().filter(|t| *t > 0)?;
        let page = u64::try_from(page).ok().filter(|p| *p > 0)?;
        Self::parse(&stat, &boot, &limits, open_fds, ticks, page)
    }

    /// The reading from the files' text (`/proc/self/stat`, `/proc/stat`,
    /// `/proc/self/limits`), the descriptors counted in `/proc/self/fd`
    /// (the directory's own, read as it is listed, among them, as client
    /// libraries count it), clock ticks per second and the page size.
    pub fn parse(
        stat: &str,
        boot: &str,
        limits: &str,
        open_fds: u64,
        ticks: u64,
        page: u64,
    ) -> Option<Self> {
        // The command name may hold spaces and parentheses: the fields
        // start after the last `)`, at the third (state).
        let fields: Vec<&str> = stat
            .get(stat.rfind(')')? + 1..)?
            .split_whitespace()
            .collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let (utime, stime) = (field(14)?, field(15)?);
        let (start, vsize, rss) = (field(22)?, field(23)?, field(24)?);
        let btime = boot
            .lines()
            .find_map(|line| line.strip_prefix("btime "))?
            .trim()
            .parse::<u64>()
            .ok()?;
        let max_fds = limits.lines().find_map(|line| {
            let rest = line.strip_prefix("Max open files")?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        });
        Some(Self {
            resident_memory_bytes: rss.saturating_mul(page),
            virtual_memory_bytes: vsize,
            cpu_seconds: (utime + stime) as f64 / ticks as f64,
            open_fds,
            max_fds,
            start_time_seconds: btime as f64 + start as f64 / ticks as f64,
        })
    }
}

/// The collector a registry takes ([`register`]).
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(process) = Process::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(process.cpu_seconds);
        let metric = encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?;
        cpu.encode(metric)?;
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut gauges = vec![
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                gauge(process.resident_memory_bytes),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                gauge(process.virtual_memory_bytes),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                gauge(process.open_fds),
            ),
        ];
        if let Some(max) = process.max_fds {
            gauges.push((
                "process_max_fds",
                "Maximum number of open file descriptors.",
                gauge(max),
            ));
        }
        for (name, help, value) in gauges {
            let metric = ConstGauge::new(value);
            let encoded = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(encoded)?;
        }
        let start = ConstGauge::new(process.start_time_seconds);
        let metric = encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            None,
            start.metric_type(),
        )?;
        start.encode(metric)
    }
}

/// Adds the `process_*` series to `registry`, which must have no prefix:
/// they are named as every exporter names them.
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_are_read_as_client_libraries_read_them() {
        let stat = "4242 (char on) (x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 9 0 12000 123456789 2048 18446744073709551615";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1048576              1048576              files\n";
        let process = Process::parse(stat, boot, limits, 12, 100, 4096).expect("parsed");
        assert_eq!(
            process,
            Process {
                resident_memory_bytes: 2048 * 4096,
                virtual_memory_bytes: 123_456_789,
                cpu_seconds: 3.0,
                open_fds: 12,
                max_fds: Some(1_048_576),
                start_time_seconds: 1_700_000_120.0,
            }
        );
        assert_eq!(Process::parse("garbage", boot, limits, 1, 100, 4096), None);
    }

    #[test]
    fn this_process_is_read_and_encoded() {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoded");
        if Process::read().is_some() {
            for name in [
                "process_resident_memory_bytes ",
                "process_virtual_memory_bytes ",
                "process_cpu_seconds_total ",
                "process_open_fds ",
                "process_max_fds ",
                "process_start_time_seconds ",
            ] {
                assert!(
                    text.lines().any(|l| l.starts_with(name)),
                    "{name} in\n{text}"
                );
            }
        }
    }
}
