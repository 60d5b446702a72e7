//! The sidecar's Tokio runtime, and why it is single-threaded on one CPU.
//!
//! On a multi-threaded runtime a request's task, when it finishes, wakes its
//! HTTP/2 connection's task into the worker's "LIFO slot", which runs it at
//! once: every answer leaves in its own `writev` (0.94 per answer at 64 in
//! flight). A single-threaded runtime queues the woken connection behind
//! the other ready requests, so one write carries several answers (0.14 per
//! answer), which costs less CPU per decision and cuts the tail
//! (docs/performance.md). A sidecar usually has one CPU; there the
//! single-threaded runtime is chosen, and elsewhere one worker per CPU.

use std::io;
use std::num::NonZeroUsize;

/// The shape of runtime for `--threads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Everything on the thread that runs the server.
    SingleThreaded,
    /// This many worker threads.
    Workers(usize),
}

impl Shape {
    /// `threads` 0 means one per CPU this process may run on (`available`).
    pub fn for_threads(threads: usize, available: NonZeroUsize) -> Self {
        match if threads == 0 {
            available.get()
        } else {
            threads
        } {
            1 => Shape::SingleThreaded,
            n => Shape::Workers(n),
        }
    }
}

/// The runtime for `--threads` (0: by the CPUs this process may use, which
/// counts CPU affinity and cgroup quotas).
pub fn build(threads: usize) -> io::Result<tokio::runtime::Runtime> {
    let available = std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN);
    match Shape::for_threads(threads, available) {
        Shape::SingleThreaded => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Shape::Workers(workers) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
    }

    #[test]
    fn one_cpu_or_one_thread_is_single_threaded() {
        assert_eq!(Shape::for_threads(0, cpus(1)), Shape::SingleThreaded);
        assert_eq!(Shape::for_threads(1, cpus(8)), Shape::SingleThreaded);
    }

    #[test]
    fn otherwise_one_worker_per_cpu_or_as_asked() {
        assert_eq!(Shape::for_threads(0, cpus(4)), Shape::Workers(4));
        assert_eq!(Shape::for_threads(3, cpus(1)), Shape::Workers(3));
    }

    #[test]
    fn both_shapes_run_a_server_task() {
        for threads in [1, 2] {
            let runtime = build(threads).expect("a runtime");
            let answer = runtime
                .block_on(async { tokio::spawn(async { 42 }).await.expect("the task runs") });
            assert_eq!(answer, 42);
        }
    }
}
