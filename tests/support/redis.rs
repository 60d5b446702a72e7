//! Real Redis processes for integration tests: a standalone server, a
//! three-master cluster, and a master watched by one sentinel.
//!
//! Tests run against real `redis-server` binaries (7.x, installed by
//! `scripts/test-deps.sh`), never a mock and never a shared server: every
//! process this harness starts is its own child, on a port picked free at
//! run time (never 6379), with its own temporary directory, persistence
//! turned off. The harness owns those processes and stops them by PID
//! (`SIGKILL` through [`std::process::Child::kill`]) when their handle is
//! dropped, so a failing test does not leave servers behind. Only a test
//! binary that is itself killed can orphan them.
//!
//! It uses std and `tempfile` only. The binaries are looked up on `PATH`, or taken
//! from `$CHARON_REDIS_SERVER` and `$CHARON_REDIS_CLI`.

use std::collections::HashSet;
use std::collections::hash_map::RandomState;
use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long a server (or sentinel) may take to answer after it is launched.
const START_DEADLINE: Duration = Duration::from_secs(10);
/// How long a new cluster may take to reach `cluster_state:ok` on every node.
const CLUSTER_DEADLINE: Duration = Duration::from_secs(20);
/// How often readiness is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(25);
/// How many fresh ports a start tries when the port it picked got taken
/// between the check and the server's own bind.
const PORT_ATTEMPTS: usize = 5;
/// Redis cluster nodes also listen on `port + CLUSTER_BUS_OFFSET`.
const CLUSTER_BUS_OFFSET: u16 = 10_000;
/// Cluster ports are picked here, so that the bus port stays below 50000.
const CLUSTER_PORT_RANGE: std::ops::Range<u16> = 20_000..40_000;
/// Ports never handed out, whatever the OS says: the well-known ones, in case
/// a developer's own Redis or Sentinel is momentarily down.
const FORBIDDEN_PORTS: [u16; 2] = [6379, 26379];
/// The master name the sentinel monitors.
pub const SENTINEL_MASTER_NAME: &str = "charon";

/// Ports handed out by this process, so two tests running in parallel never
/// get the same one (the OS could hand a just-released port out again).
static RESERVED_PORTS: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

fn redis_server_binary() -> String {
    std::env::var("CHARON_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

fn redis_cli_binary() -> String {
    std::env::var("CHARON_REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

/// Records `ports` as taken, unless one of them already is (or is forbidden).
fn reserve(ports: &[u16]) -> bool {
    let mut reserved = RESERVED_PORTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let reserved = reserved.get_or_insert_with(HashSet::new);
    if ports
        .iter()
        .any(|port| FORBIDDEN_PORTS.contains(port) || reserved.contains(port))
    {
        return false;
    }
    reserved.extend(ports);
    true
}

fn can_bind(port: u16) -> Option<TcpListener> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok()
}

/// A port on 127.0.0.1 that nothing listens on right now and that this
/// process has not handed out before.
/// A Redis store on Redis time with a generous deadline: the machine is
/// shared with other tests.
pub fn patient_store(url: &str) -> charon::store::RedisStore {
    charon::store::RedisStore::open(
        url,
        charon::store::RedisOptions {
            timeout: Duration::from_secs(5),
            ..charon::store::RedisOptions::default()
        },
    )
    .expect("a valid URL")
}

pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|error| panic!("cannot bind 127.0.0.1:0 to find a free port: {error}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|error| panic!("cannot read the port bound on 127.0.0.1:0: {error}"))
            .port();
        drop(listener);
        if reserve(&[port]) {
            return port;
        }
    }
    panic!("no free port found on 127.0.0.1 after 1000 tries");
}

/// A free port for a cluster node: both `port` and its cluster bus port
/// (`port + 10000`) are free, picked at random in 20000..40000.
pub fn free_cluster_port() -> u16 {
    let span = u64::from(CLUSTER_PORT_RANGE.end - CLUSTER_PORT_RANGE.start);
    let seed = RandomState::new();
    for attempt in 0u64..1000 {
        let mut hasher = seed.build_hasher();
        hasher.write_u64(attempt);
        let offset = u16::try_from(hasher.finish() % span).expect("offset is below the span");
        let port = CLUSTER_PORT_RANGE.start + offset;
        let bus_port = port + CLUSTER_BUS_OFFSET;
        let both_free = can_bind(port).is_some_and(|_held| can_bind(bus_port).is_some());
        if both_free && reserve(&[port, bus_port]) {
            return port;
        }
    }
    panic!("no free cluster port (with a free bus port) found in {CLUSTER_PORT_RANGE:?}");
}

/// Runs `redis-cli -h 127.0.0.1 -p <port> <args>` and returns its trimmed
/// stdout. Redis error replies are printed on stdout too (`ERR …`), so check
/// the text. Panics if redis-cli cannot run or fails (e.g. nothing listens).
pub fn command(port: u16, args: &[&str]) -> String {
    try_command(port, args).unwrap_or_else(|error| panic!("{error}"))
}

/// [`command`] that returns the failure (redis-cli missing, or exiting
/// non-zero, as when nothing listens on `port`) instead of panicking.
pub fn try_command(port: u16, args: &[&str]) -> Result<String, String> {
    let port_arg = port.to_string();
    let mut cli_args = vec!["-h", "127.0.0.1", "-p", &port_arg];
    cli_args.extend_from_slice(args);
    run_cli(&cli_args)
}

fn run_cli(args: &[&str]) -> Result<String, String> {
    let cli = redis_cli_binary();
    let output = Command::new(&cli)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|error| {
            format!("cannot run `{cli}` (install it with scripts/test-deps.sh): {error}")
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "`{cli} {}` failed ({}):\nstdout: {stdout}\nstderr: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim(),
        ))
    }
}

/// Sends one command over a raw RESP connection and returns the first line of
/// the reply, or the whole payload of a bulk string reply.
fn raw_command(port: u16, args: &[&str]) -> io::Result<String> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(250))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;

    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end().to_owned();
    let Some(length) = line.strip_prefix('$') else {
        return Ok(line);
    };
    let length: usize = length
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("bad reply {line:?}")))?;
    let mut payload = vec![0; length];
    reader.read_exact(&mut payload)?;
    Ok(String::from_utf8_lossy(&payload).into_owned())
}

/// What a [`RedisServer`] process runs as; decides its command line.
#[derive(Clone, Copy, Debug)]
enum Role {
    Standalone,
    ClusterNode,
    /// A sentinel monitoring the master on this port.
    Sentinel {
        master_port: u16,
    },
}

/// Why a launch failed.
struct LaunchFailure {
    /// The server reported that its port (or bus port) was taken: worth
    /// another try on another port.
    port_in_use: bool,
    message: String,
}

/// One `redis-server` process (a plain server, a cluster node or a sentinel)
/// owned by the test: killed by PID when dropped, its directory removed.
pub struct RedisServer {
    pub port: u16,
    role: Role,
    child: Option<Child>,
    /// Working directory (`--dir`), holding the log and, for a cluster node,
    /// `nodes.conf`, for a sentinel `sentinel.conf`. Kept across restarts.
    dir: TempDir,
}

impl RedisServer {
    /// Starts a standalone server on a free port, persistence off.
    pub fn start() -> RedisServer {
        Self::start_on_free_port(Role::Standalone, free_port)
    }

    /// Starts a standalone server on `port`, e.g. the port of a server just
    /// killed, to simulate a restart that lost all data.
    pub fn start_on(port: u16) -> RedisServer {
        Self::launch(Role::Standalone, port, new_dir())
            .unwrap_or_else(|failure| panic!("{}", failure.message))
    }

    fn start_on_free_port(role: Role, pick_port: fn() -> u16) -> RedisServer {
        let mut failures = Vec::new();
        for _ in 0..PORT_ATTEMPTS {
            match Self::launch(role, pick_port(), new_dir()) {
                Ok(server) => return server,
                Err(failure) if failure.port_in_use => failures.push(failure.message),
                Err(failure) => panic!("{}", failure.message),
            }
        }
        panic!(
            "redis-server ({role:?}) found its port taken {PORT_ATTEMPTS} times:\n{}",
            failures.join("\n")
        );
    }

    fn launch(role: Role, port: u16, dir: TempDir) -> Result<RedisServer, LaunchFailure> {
        let mut server = RedisServer {
            port,
            role,
            child: None,
            dir,
        };
        server.spawn()?;
        Ok(server)
    }

    /// Launches the process (in the same directory, on the same port) and
    /// waits until it answers. On failure the process is already killed.
    fn spawn(&mut self) -> Result<(), LaunchFailure> {
        assert!(
            self.child.is_none(),
            "redis-server on port {} is already running",
            self.port
        );
        let log = File::create(self.log_path()).map_err(|error| LaunchFailure {
            port_in_use: false,
            message: format!("cannot create {}: {error}", self.log_path().display()),
        })?;
        let log_for_stderr = log.try_clone().map_err(|error| LaunchFailure {
            port_in_use: false,
            message: format!("cannot duplicate the log file handle: {error}"),
        })?;
        let binary = redis_server_binary();
        let child = Command::new(&binary)
            .args(self.arguments()?)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_for_stderr)
            .spawn()
            .map_err(|error| LaunchFailure {
                port_in_use: false,
                message: format!(
                    "cannot run `{binary}` (install it with scripts/test-deps.sh): {error}"
                ),
            })?;
        self.child = Some(child);
        let result = self.wait_until_ready();
        if result.is_err() {
            self.kill();
        }
        result
    }

    fn arguments(&self) -> Result<Vec<String>, LaunchFailure> {
        let dir = self.dir.path().to_string_lossy().into_owned();
        let mut arguments: Vec<String> = match self.role {
            Role::Sentinel { master_port } => {
                let config_path = self.dir.path().join("sentinel.conf");
                // Written once: a restarted sentinel reads back what it rewrote.
                if !config_path.exists() {
                    let config = format!(
                        "port {port}\n\
                         bind 127.0.0.1\n\
                         daemonize no\n\
                         loglevel warning\n\
                         dir {dir}\n\
                         sentinel monitor {name} 127.0.0.1 {master_port} 1\n\
                         sentinel down-after-milliseconds {name} 1000\n",
                        port = self.port,
                        name = SENTINEL_MASTER_NAME,
                    );
                    fs::write(&config_path, config).map_err(|error| LaunchFailure {
                        port_in_use: false,
                        message: format!("cannot write {}: {error}", config_path.display()),
                    })?;
                }
                return Ok(vec![
                    config_path.to_string_lossy().into_owned(),
                    "--sentinel".to_owned(),
                ]);
            }
            Role::Standalone | Role::ClusterNode => [
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &dir,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                // `DEBUG SLEEP` stalls Redis on purpose in the copy tests.
                "--enable-debug-command",
                "local",
                // Beside the port, as envoyproxy/ratelimit reaches Redis
                // by default (`REDIS_SOCKET_TYPE=unix`).
                "--unixsocket",
                &format!("{dir}/redis.sock"),
                "--unixsocketperm",
                "700",
            ]
            .map(str::to_owned)
            .to_vec(),
        };
        if let Role::ClusterNode = self.role {
            arguments.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ]
                .map(str::to_owned),
            );
        }
        Ok(arguments)
    }

    /// Waits until our own process (checked by PID, in case another server
    /// grabbed the port) answers PING.
    fn wait_until_ready(&mut self) -> Result<(), LaunchFailure> {
        let started = Instant::now();
        let pid = self.pid().expect("spawn() set the child").to_string();
        loop {
            if let Some(status) = self.exit_status() {
                let log = self.log();
                return Err(LaunchFailure {
                    port_in_use: log.contains("Address already in use"),
                    message: format!(
                        "redis-server ({:?}) on port {} exited before answering ({status}); log:\n{log}",
                        self.role, self.port
                    ),
                });
            }
            let answers_ping =
                raw_command(self.port, &["PING"]).is_ok_and(|reply| reply == "+PONG");
            if answers_ping
                && raw_command(self.port, &["INFO", "server"]).is_ok_and(|info| {
                    info.lines()
                        .any(|line| line.trim() == format!("process_id:{pid}"))
                })
            {
                return Ok(());
            }
            if started.elapsed() > START_DEADLINE {
                return Err(LaunchFailure {
                    port_in_use: false,
                    message: format!(
                        "redis-server ({:?}) on port {} did not answer PING within {START_DEADLINE:?}; log:\n{}",
                        self.role,
                        self.port,
                        self.log()
                    ),
                });
            }
            sleep(POLL_INTERVAL);
        }
    }

    fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// `redis://127.0.0.1:<port>`.
    /// The server's Unix socket (standalone servers and cluster nodes).
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// [`command`] against this server.
    pub fn command(&self, args: &[&str]) -> String {
        command(self.port, args)
    }

    /// Kills the process (SIGKILL, by PID) and waits for it to exit. Does
    /// nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Fails only if it already exited; waiting reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same port and directory (a cluster
    /// node keeps its identity from `nodes.conf`); kills it first if it runs.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(failure) = self.spawn() {
            panic!("restart failed: {}", failure.message);
        }
    }

    /// Whether the process is still running (it may have crashed).
    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.exit_status().is_none()
    }

    /// The working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Everything the process wrote to stdout and stderr.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path())
            .unwrap_or_else(|error| format!("(cannot read {}: {error})", self.log_path().display()))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn new_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("charon-redis-")
        .tempdir()
        .unwrap_or_else(|error| {
            panic!("cannot create a temporary directory for redis-server: {error}")
        })
}

/// Polls `ready` until it returns `Ok`, or panics after `deadline` with the
/// last `Err` and `what`.
fn wait_for(what: &str, deadline: Duration, mut ready: impl FnMut() -> Result<(), String>) {
    let started = Instant::now();
    loop {
        let last_error = match ready() {
            Ok(()) => return,
            Err(error) => error,
        };
        if started.elapsed() > deadline {
            panic!("{what} did not happen within {deadline:?}; last seen: {last_error}");
        }
        sleep(POLL_INTERVAL);
    }
}

/// A Redis cluster of masters only, each slot range on one node.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` cluster nodes (at least 3, as `redis-cli --cluster
    /// create` demands), creates the cluster without replicas and waits until
    /// every node reports `cluster_state:ok`.
    pub fn start(masters: usize) -> RedisCluster {
        Self::start_with_replicas(masters, 0)
    }

    /// The same with `replicas` replicas per master: a master killed is
    /// replaced by its replica after the node timeout (2 s).
    pub fn start_with_replicas(masters: usize, replicas: usize) -> RedisCluster {
        assert!(
            masters >= 3,
            "a Redis cluster needs at least 3 masters, not {masters}"
        );
        let nodes = (0..masters * (1 + replicas))
            .map(|_| RedisServer::start_on_free_port(Role::ClusterNode, free_cluster_port))
            .collect();
        let mut cluster = RedisCluster { nodes };

        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let mut create = vec!["--cluster", "create"];
        create.extend(addresses.iter().map(String::as_str));
        let replica_count = replicas.to_string();
        create.extend(["--cluster-replicas", &replica_count, "--cluster-yes"]);
        if let Err(error) = run_cli(&create) {
            panic!(
                "cannot create the Redis cluster: {error}\n{}",
                cluster.logs()
            );
        }

        cluster.wait_ok();
        if replicas > 0 {
            cluster.wait_replicas_synced();
        }
        cluster
    }

    /// Waits until every replica has finished its first sync with its
    /// master: a replica that never synced cannot be promoted.
    fn wait_replicas_synced(&self) {
        for node in &self.nodes {
            let port = node.port;
            let role = try_command(port, &["ROLE"]).unwrap_or_default();
            if !role.starts_with("slave") {
                continue;
            }
            let what = format!("replica 127.0.0.1:{port} in sync with its master");
            wait_for(&what, CLUSTER_DEADLINE, || {
                let info = try_command(port, &["INFO", "replication"])?;
                if info
                    .lines()
                    .any(|line| line.trim() == "master_link_status:up")
                {
                    Ok(())
                } else {
                    Err(info)
                }
            });
        }
    }

    /// The ports of the nodes that are masters now, by `CLUSTER NODES`
    /// asked of a live node.
    pub fn master_ports(&mut self) -> Vec<u16> {
        let node = self
            .nodes
            .iter_mut()
            .find_map(|node| node.is_running().then_some(node))
            .expect("a live node");
        let text = command(node.port, &["CLUSTER", "NODES"]);
        text.lines()
            .filter(|line| {
                let flags = line.split_whitespace().nth(2).unwrap_or("");
                flags.contains("master") && !flags.contains("fail")
            })
            .filter_map(|line| {
                let address = line.split_whitespace().nth(1)?;
                let port = address.split(['@', ',']).next()?.rsplit(':').next()?;
                port.parse().ok()
            })
            .collect()
    }

    /// The port of the master serving `key`'s slot now, by `CLUSTER KEYSLOT`
    /// and the slot ranges of `CLUSTER NODES`, asked of a live node.
    pub fn master_of(&mut self, key: &str) -> u16 {
        let node = self
            .nodes
            .iter_mut()
            .find_map(|node| node.is_running().then_some(node))
            .expect("a live node");
        let slot: u16 = command(node.port, &["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("CLUSTER KEYSLOT answers a number");
        let nodes = command(node.port, &["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2).copied().unwrap_or("");
            if !flags.contains("master") || flags.contains("fail") {
                continue;
            }
            let serves = fields.iter().skip(8).any(|range| {
                let mut ends = range.split('-').map(|end| end.parse::<u16>().ok());
                match (ends.next().flatten(), ends.next()) {
                    (Some(low), None) => low == slot,
                    (Some(low), Some(Some(high))) => (low..=high).contains(&slot),
                    _ => false,
                }
            });
            if serves {
                let address = fields.get(1).copied().unwrap_or("");
                let port = address
                    .split(['@', ','])
                    .next()
                    .and_then(|a| a.rsplit(':').next().and_then(|port| port.parse().ok()));
                if let Some(port) = port {
                    return port;
                }
            }
        }
        panic!("no master serves slot {slot} of {key}:\n{nodes}");
    }

    /// Waits until every live node says `cluster_state:ok`.
    pub fn wait_ok(&mut self) {
        for node in self.nodes.iter_mut() {
            if !node.is_running() {
                continue;
            }
            let port = node.port;
            let what = format!("cluster_state:ok on node 127.0.0.1:{port}");
            wait_for(&what, CLUSTER_DEADLINE, || {
                let info = try_command(port, &["CLUSTER", "INFO"])?;
                if info.lines().any(|line| line.trim() == "cluster_state:ok") {
                    Ok(())
                } else {
                    Err(info)
                }
            });
        }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…`.
    pub fn url(&self) -> String {
        let addresses: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("redis+cluster://{}", addresses.join(","))
    }

    /// `redis://127.0.0.1:Pi` for every node.
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// [`command`] in cluster mode (`redis-cli -c`, following redirections),
    /// sent to the first node.
    pub fn command(&self, args: &[&str]) -> String {
        let mut cluster_args = vec!["-c"];
        cluster_args.extend_from_slice(args);
        command(self.nodes[0].port, &cluster_args)
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("--- node {} log:\n{}", node.port, node.log()))
            .collect()
    }
}

/// A standalone master and one sentinel monitoring it under the name
/// [`SENTINEL_MASTER_NAME`] (quorum 1, down after 1 s).
pub struct RedisSentinel {
    pub master: RedisServer,
    pub sentinel: RedisServer,
}

impl RedisSentinel {
    /// Starts the master, then the sentinel, and waits until the sentinel
    /// reports the master's address.
    pub fn start() -> RedisSentinel {
        let master = RedisServer::start();
        let role = Role::Sentinel {
            master_port: master.port,
        };
        let sentinel = RedisServer::start_on_free_port(role, free_port);
        let master_port = master.port.to_string();
        wait_for(
            &format!("sentinel reporting the master on port {master_port}"),
            START_DEADLINE,
            || {
                let reply = try_command(
                    sentinel.port,
                    &["SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER_NAME],
                )?;
                if reply.lines().any(|line| line.trim() == master_port) {
                    Ok(())
                } else {
                    Err(reply)
                }
            },
        );
        RedisSentinel { master, sentinel }
    }

    /// `redis+sentinel://127.0.0.1:<sentinel port>/charon`.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://127.0.0.1:{}/{SENTINEL_MASTER_NAME}",
            self.sentinel.port
        )
    }
}
