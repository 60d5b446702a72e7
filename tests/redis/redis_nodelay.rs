//! Nagle's algorithm is off on every connection the Redis store makes, to one
//! Redis, to a cluster's nodes and to the master Sentinel names: a decision
//! is one small script call, and with Nagle on a call that follows another
//! before its ACK waits up to 40 ms. Checked on the real sockets of this
//! process (`/proc/self/fd`), by asking the kernel for `TCP_NODELAY`.
#![cfg(target_os = "linux")]

use crate::support;

use std::os::fd::RawFd;

use charon::engine::{Item, SlotKind, WindowItem};
use charon::store::{Batch, RedisStore, Store};
use support::redis::{RedisCluster, RedisSentinel, RedisServer, patient_store};

/// The peer port of socket `fd`, if it is a TCP socket over IPv4 or IPv6.
fn peer_port(fd: RawFd) -> Option<u16> {
    // SAFETY: a zeroed sockaddr_storage is a valid buffer for getpeername,
    // whose length argument says how much of it may be written.
    unsafe {
        let mut address: libc::sockaddr_storage = std::mem::zeroed();
        let mut length = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getpeername(fd, (&raw mut address).cast(), &mut length) != 0 {
            return None;
        }
        match i32::from(address.ss_family) {
            libc::AF_INET => {
                let v4: &libc::sockaddr_in = &*(&raw const address).cast();
                Some(u16::from_be(v4.sin_port))
            }
            libc::AF_INET6 => {
                let v6: &libc::sockaddr_in6 = &*(&raw const address).cast();
                Some(u16::from_be(v6.sin6_port))
            }
            _ => None,
        }
    }
}

fn nodelay(fd: RawFd) -> bool {
    let mut value: libc::c_int = 0;
    let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `length` are valid for getsockopt to write.
    let result = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&raw mut value).cast(),
            &mut length,
        )
    };
    assert_eq!(result, 0, "getsockopt on fd {fd}");
    value != 0
}

/// This process's sockets connected to one of `ports`, with their NODELAY.
fn sockets_to(ports: &[u16]) -> Vec<(RawFd, u16, bool)> {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<RawFd>().ok())
        .filter_map(|fd| {
            let port = peer_port(fd)?;
            ports.contains(&port).then(|| (fd, port, nodelay(fd)))
        })
        .collect()
}

async fn decide_once(store: &RedisStore) {
    let mut batch = Batch::default();
    let slot = batch.slot("nodelay-test".into(), SlotKind::Window);
    batch.items.push(Item::Window(WindowItem {
        slot,
        limit: 10,
        period: 60_000,
        hits: 1,
        shadow: false,
        count_rejected: false,
    }));
    store.decide(batch).await.expect("Redis decides");
}

fn assert_nodelay(sockets: &[(RawFd, u16, bool)], what: &str) {
    assert!(!sockets.is_empty(), "{what}: no connection found");
    for (fd, port, on) in sockets {
        assert!(
            on,
            "{what}: the socket (fd {fd}) to port {port} has Nagle on"
        );
    }
}

#[tokio::test]
async fn one_redis() {
    let redis = RedisServer::start();
    let store = patient_store(&redis.url());
    decide_once(&store).await;
    assert_nodelay(&sockets_to(&[redis.port]), "redis://");
}

#[tokio::test]
async fn a_cluster() {
    let cluster = RedisCluster::start(3);
    let store = patient_store(&cluster.url());
    decide_once(&store).await;
    let ports: Vec<u16> = cluster.nodes.iter().map(|node| node.port).collect();
    assert_nodelay(&sockets_to(&ports), "redis+cluster://");
}

#[tokio::test]
async fn the_master_sentinel_names() {
    let deployment = RedisSentinel::start();
    let store = patient_store(&deployment.url());
    decide_once(&store).await;
    assert_nodelay(&sockets_to(&[deployment.master.port]), "redis+sentinel://");
}
