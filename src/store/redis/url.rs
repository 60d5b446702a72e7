//! `--store` values: where the Redis store connects.
//!
//! - `redis://[user:password@]host:port[/db]` and `rediss://…` (TLS): one
//!   Redis (redis-rs parses these itself, `#insecure` included);
//! - `redis+sentinel://[user:password@]host:port[,host:port…]/service[/db]`
//!   (`rediss+sentinel://` for TLS to the master): the master that Sentinel
//!   names for `service`, followed across failovers; the credentials and db are
//!   the master's, the sentinels are asked without them;
//! - `redis+cluster://[user:password@]host:port[,host:port…]`
//!   (`rediss+cluster://` for TLS): Redis Cluster, from any of its nodes;
//! - `redis+unix:///path/to/redis.sock[?db=N&user=U&pass=P]` (or `unix://`):
//!   one Redis on a Unix socket, as envoyproxy/ratelimit's
//!   `REDIS_SOCKET_TYPE=unix` reaches it.

use super::RedisError;

/// A parsed `--store` value for Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One URL that redis-rs understands.
    Single(String),
    Sentinel {
        /// `redis://host:port` of every sentinel.
        sentinels: Vec<String>,
        service: String,
        /// The master's URL prefix (`redis://user:password@`), for its
        /// credentials; the host comes from Sentinel.
        master: MasterAuth,
    },
    /// One URL per seed node, each with the credentials.
    Cluster(Vec<String>),
}

/// Credentials, TLS and db for the master that Sentinel names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterAuth {
    pub tls: bool,
    /// `user:password` as written in the URL (still percent-encoded).
    pub userinfo: Option<String>,
    pub db: i64,
}

impl MasterAuth {
    /// The master's URL once Sentinel has named its address.
    pub fn url(&self, host: &str, port: u16) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let userinfo = self
            .userinfo
            .as_ref()
            .map_or(String::new(), |u| format!("{u}@"));
        format!("{scheme}://{userinfo}{host}:{port}/{}", self.db)
    }
}

fn is_unix(scheme: &str) -> bool {
    scheme == "redis+unix" || scheme == "unix"
}

fn bad(url: &str, why: &str) -> RedisError {
    RedisError::Url(format!("{}: {why}", redact(url)))
}

/// `url` without its password, for messages and logs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    if is_unix(scheme) {
        // The password of a socket URL is in its query (`pass=`).
        return match url.split_once('?') {
            Some((path, query)) => {
                let query: Vec<String> = query
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some(("pass", _)) => "pass=***".to_owned(),
                        _ => pair.to_owned(),
                    })
                    .collect();
                format!("{path}?{}", query.join("&"))
            }
            None => url.to_string(),
        };
    }
    match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            format!("{scheme}://{user}:***@{hosts}")
        }
        None => url.to_string(),
    }
}

/// `url` with `user` and `password` written into it (percent-encoded), for
/// a password that comes from a file or the environment instead of the URL
/// (so it is not on the command line). The URL must not carry a password
/// of its own: one place only. A user in the URL stays unless `user` is
/// given.
pub fn with_credentials(
    url: &str,
    user: Option<&str>,
    password: &str,
) -> Result<String, RedisError> {
    use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(url, "a store password needs a Redis URL, not `memory`"));
    };
    if is_unix(scheme) {
        if url.contains("pass=") {
            return Err(bad(
                url,
                "the URL has a password and one is given by file or environment too: give it in one place",
            ));
        }
        let mut query = vec![format!(
            "pass={}",
            utf8_percent_encode(password, NON_ALPHANUMERIC)
        )];
        if let Some(user) = user {
            query.insert(
                0,
                format!("user={}", utf8_percent_encode(user, NON_ALPHANUMERIC)),
            );
        }
        let joiner = if url.contains('?') { '&' } else { '?' };
        return Ok(format!("{url}{joiner}{}", query.join("&")));
    }
    // The userinfo ends at the last `@` before the path.
    let authority = rest
        .split_once('/')
        .map_or(rest, |(authority, _)| authority);
    let (written, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, _)) => (Some(userinfo), &rest[userinfo.len() + 1..]),
        None => (None, rest),
    };
    let written_user = match written.map(|userinfo| userinfo.split_once(':')) {
        Some(Some(_)) => {
            return Err(bad(
                url,
                "the URL has a password and one is given by file or environment too: give it in one place",
            ));
        }
        Some(None) => written,
        None => None,
    };
    let user = match user {
        Some(user) => utf8_percent_encode(user, NON_ALPHANUMERIC).to_string(),
        None => written_user.unwrap_or_default().to_owned(),
    };
    let password = utf8_percent_encode(password, NON_ALPHANUMERIC);
    Ok(format!("{scheme}://{user}:{password}@{hosts}"))
}

/// Parses a Redis `--store` value.
pub fn parse(url: &str) -> Result<Target, RedisError> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(
            url,
            "expected `memory`, redis://, rediss://, redis+sentinel:// or redis+cluster://",
        ));
    };
    match scheme {
        "redis" | "rediss" | "redis+unix" | "unix" => {
            // Let redis-rs say what is wrong with the rest.
            redis::Client::open(url).map_err(|e| bad(url, &e.to_string()))?;
            Ok(Target::Single(url.to_string()))
        }
        "redis+sentinel" | "rediss+sentinel" => {
            let (userinfo, hosts, path) = split(url, rest)?;
            let mut parts = path.split('/').filter(|p| !p.is_empty());
            let service = parts
                .next()
                .ok_or_else(|| bad(url, "the sentinel service name is missing (…/service)"))?
                .to_string();
            let db = match parts.next() {
                None => 0,
                Some(db) => db
                    .parse()
                    .map_err(|_| bad(url, "the database after the service is not a number"))?,
            };
            Ok(Target::Sentinel {
                sentinels: hosts.iter().map(|h| format!("redis://{h}")).collect(),
                service,
                master: MasterAuth {
                    tls: scheme == "rediss+sentinel",
                    userinfo,
                    db,
                },
            })
        }
        "redis+cluster" | "rediss+cluster" => {
            let (userinfo, hosts, path) = split(url, rest)?;
            if !path.trim_matches('/').is_empty() {
                return Err(bad(url, "Redis Cluster has no databases: remove the path"));
            }
            let node_scheme = if scheme == "rediss+cluster" {
                "rediss"
            } else {
                "redis"
            };
            let userinfo = userinfo.map_or(String::new(), |u| format!("{u}@"));
            let nodes: Vec<String> = hosts
                .iter()
                .map(|h| format!("{node_scheme}://{userinfo}{h}"))
                .collect();
            for node in &nodes {
                redis::Client::open(node.as_str()).map_err(|e| bad(url, &e.to_string()))?;
            }
            Ok(Target::Cluster(nodes))
        }
        _ => Err(bad(
            url,
            "unknown scheme; expected redis://, rediss://, redis+sentinel:// or redis+cluster://",
        )),
    }
}

/// Splits `[userinfo@]h:p,h:p[/path]` into its parts.
fn split<'u>(
    url: &str,
    rest: &'u str,
) -> Result<(Option<String>, Vec<&'u str>, &'u str), RedisError> {
    let (userinfo, after) = match rest.rsplit_once('@') {
        Some((userinfo, after)) => (Some(userinfo.to_string()), after),
        None => (None, rest),
    };
    let (hosts, path) = after.split_once('/').unwrap_or((after, ""));
    let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err(bad(url, "expected host:port[,host:port…]"));
    }
    for host in &hosts {
        let port = host.rsplit_once(':').map(|(_, port)| port);
        if port.and_then(|p| p.parse::<u16>().ok()).is_none() {
            return Err(bad(url, &format!("`{host}` is not host:port")));
        }
    }
    Ok((userinfo, hosts, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_from_elsewhere_are_written_into_the_url() {
        assert_eq!(
            with_credentials("redis://127.0.0.1:6400/2", None, "p@ss:w/rd").unwrap(),
            "redis://:p%40ss%3Aw%2Frd@127.0.0.1:6400/2"
        );
        assert_eq!(
            with_credentials("redis+cluster://charon@a:1,b:2", None, "s").unwrap(),
            "redis+cluster://charon:s@a:1,b:2"
        );
        assert_eq!(
            with_credentials("rediss+sentinel://a:1/mymaster", Some("app"), "s").unwrap(),
            "rediss+sentinel://app:s@a:1/mymaster"
        );
        let twice = with_credentials("redis://u:hunter2@a:1", None, "s").unwrap_err();
        assert!(twice.to_string().contains("one place"), "{twice}");
        assert!(!twice.to_string().contains("hunter2"), "{twice}");
        assert!(with_credentials("memory", None, "s").is_err());
        // redis-rs reads the encoded password back as it was.
        let url = with_credentials("redis://127.0.0.1:6400", Some("üser"), "p@ss:w/rd").unwrap();
        let info = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection_info()
            .clone();
        assert_eq!(info.redis_settings().password(), Some("p@ss:w/rd"));
        assert_eq!(info.redis_settings().username(), Some("üser"));
    }

    #[test]
    fn a_unix_socket_carries_its_credentials_in_the_query() {
        let url = with_credentials("redis+unix:///run/redis.sock", Some("app"), "p@ss").unwrap();
        assert_eq!(url, "redis+unix:///run/redis.sock?user=app&pass=p%40ss");
        assert_eq!(
            redact(&url),
            "redis+unix:///run/redis.sock?user=app&pass=***"
        );
        assert_eq!(parse(&url), Ok(Target::Single(url.clone())));
        let info = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection_info()
            .clone();
        assert_eq!(info.redis_settings().password(), Some("p@ss"));
        assert!(with_credentials(&url, None, "again").is_err());
    }

    #[test]
    fn every_form_parses() {
        assert_eq!(
            parse("redis://127.0.0.1:6400/2"),
            Ok(Target::Single("redis://127.0.0.1:6400/2".into()))
        );
        assert_eq!(
            parse("redis+cluster://u:p@a:1,b:2"),
            Ok(Target::Cluster(vec![
                "redis://u:p@a:1".into(),
                "redis://u:p@b:2".into()
            ]))
        );
        let Ok(Target::Sentinel {
            sentinels,
            service,
            master,
        }) = parse("redis+sentinel://:secret@s1:26379,s2:26379/mymaster/3")
        else {
            panic!("a sentinel target");
        };
        assert_eq!(sentinels, ["redis://s1:26379", "redis://s2:26379"]);
        assert_eq!(service, "mymaster");
        assert_eq!(
            master.url("10.0.0.1", 6379),
            "redis://:secret@10.0.0.1:6379/3"
        );
    }

    #[test]
    fn mistakes_are_named_without_the_password() {
        for url in [
            "redis+cluster://u:hunter2@a:1,,b:2",
            "redis+sentinel://u:hunter2@a:1",
            "redis+cluster://u:hunter2@a",
            "memcached://u:hunter2@a:1",
            "redis+cluster://u:hunter2@a:1/0",
        ] {
            let error = parse(url).expect_err(url).to_string();
            assert!(!error.contains("hunter2"), "{error}");
            assert!(error.contains("u:***@"), "{error}");
        }
    }
}
