//! Self-test of the Redis harness (`tests/support/redis.rs`): each kind of
//! deployment starts, answers, and can be killed and restarted.

use crate::support;

use support::redis::{RedisCluster, RedisSentinel, RedisServer, command, try_command};

#[test]
fn standalone_server_answers_and_restarts_empty_on_the_same_port() {
    let mut server = RedisServer::start();
    let port = server.port;
    assert_ne!(port, 6379, "the harness must never use the default port");
    assert_eq!(server.url(), format!("redis://127.0.0.1:{port}"));
    assert_eq!(command(port, &["PING"]), "PONG");
    assert_eq!(command(port, &["SET", "k", "v", "PX", "60000"]), "OK");
    let pttl: u64 = command(port, &["PTTL", "k"])
        .parse()
        .expect("PTTL of a key with a TTL should be a number");
    assert!(pttl > 0 && pttl <= 60_000, "PTTL was {pttl}");
    assert_eq!(command(port, &["DBSIZE"]), "1");

    server.kill();
    assert!(
        !server.is_running(),
        "the server should be stopped after kill()"
    );
    assert!(
        try_command(port, &["PING"]).is_err(),
        "nothing should answer on port {port} after kill()"
    );

    let restarted = RedisServer::start_on(port);
    assert_eq!(restarted.port, port);
    assert_eq!(command(port, &["PING"]), "PONG");
    assert_eq!(
        command(port, &["DBSIZE"]),
        "0",
        "a restarted server keeps nothing (persistence is off)"
    );
}

#[test]
fn restart_relaunches_the_same_server_handle() {
    let mut server = RedisServer::start();
    let first_pid = server.pid().expect("a started server has a pid");
    server.command(&["SET", "k", "v"]);
    server.restart();
    assert_ne!(
        server.pid(),
        Some(first_pid),
        "restart() should launch a new process"
    );
    assert_eq!(server.command(&["PING"]), "PONG");
    assert_eq!(server.command(&["EXISTS", "k"]), "0");
}

#[test]
fn dropping_a_server_kills_its_process() {
    let server = RedisServer::start();
    let port = server.port;
    drop(server);
    assert!(
        try_command(port, &["PING"]).is_err(),
        "nothing should answer on port {port} once the server is dropped"
    );
}

#[test]
fn cluster_reaches_ok_state_and_serves_keys() {
    let cluster = RedisCluster::start(3);
    assert_eq!(cluster.nodes.len(), 3);
    for node in &cluster.nodes {
        assert_eq!(node.command(&["PING"]), "PONG");
        let info = node.command(&["CLUSTER", "INFO"]);
        assert!(
            info.lines().any(|line| line.trim() == "cluster_state:ok"),
            "node {} CLUSTER INFO:\n{info}",
            node.port
        );
    }
    let ports: Vec<u16> = cluster.nodes.iter().map(|node| node.port).collect();
    assert_eq!(
        cluster.url(),
        format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
            ports[0], ports[1], ports[2]
        )
    );
    assert_eq!(
        cluster.node_urls(),
        ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
    );

    let first = ports[0].to_string();
    assert_eq!(command(ports[0], &["-c", "SET", "a", "1"]), "OK");
    assert_eq!(command(ports[0], &["-c", "GET", "a"]), "1");
    // Keys hashed to every node: all slots are served.
    for key in ["a", "b", "c", "d", "e", "f"] {
        assert_eq!(cluster.command(&["SET", key, &first]), "OK", "SET {key}");
        assert_eq!(cluster.command(&["GET", key]), first, "GET {key}");
    }
}

#[test]
fn sentinel_reports_its_master() {
    let deployment = RedisSentinel::start();
    let sentinel_port = deployment.sentinel.port;
    let master_port = deployment.master.port;
    assert_eq!(command(master_port, &["PING"]), "PONG");
    assert_eq!(command(sentinel_port, &["PING"]), "PONG");
    assert_eq!(
        command(
            sentinel_port,
            &["SENTINEL", "get-master-addr-by-name", "charon"]
        ),
        format!("127.0.0.1\n{master_port}")
    );
    assert_eq!(
        deployment.url(),
        format!("redis+sentinel://127.0.0.1:{sentinel_port}/charon")
    );
}

/// The server the tests run on is the one asked for: scripts/test.sh runs
/// the Redis tests a second time on Valkey, with `CHARON_REDIS_EXPECT`
/// naming a line its `INFO server` must have (`valkey_version:8.1`), so a
/// run that silently fell back to `redis-server` fails here.
#[test]
fn the_server_is_the_one_asked_for() {
    let server = RedisServer::start();
    let info = server.command(&["INFO", "server"]);
    let version = info
        .lines()
        .find(|line| line.starts_with("valkey_version:") || line.starts_with("redis_version:"))
        .unwrap_or("no version")
        .trim()
        .to_owned();
    eprintln!("the tests run on {version}");
    if let Ok(expected) = std::env::var("CHARON_REDIS_EXPECT") {
        assert!(
            info.lines().any(|line| line.trim().starts_with(&expected)),
            "CHARON_REDIS_EXPECT={expected}, but INFO server says:\n{info}"
        );
    }
}
