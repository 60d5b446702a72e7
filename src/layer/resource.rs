//! [`PerResource`]: the policy of the rate and concurrency layers. Each
//! request is one domain (tenant) and one resource, taken from the request
//! by a [`DomainOf`] and a [`ResourceOf`]; what is asked for them (hits or
//! a held copy) is the [`Kind`]'s.

use http::Request;

use crate::client::Client;

use super::key::{DomainOf, Fixed, Header, MissingDomain, ResourceOf, resolve_domain};
use super::limit::LimitLayer;
use super::policy::Verdict;
use super::policy::{Asked, Deciding, Options, Policy};

/// What one (resource, domain) is asked for: hits ([`Hits`](super::Hits))
/// or a held copy ([`Copies`](super::Copies)).
pub trait Kind: Clone + Send + Sync + 'static {
    type Decided: Send + 'static;

    fn ask(
        &self,
        client: &Client,
        namespace: &str,
        resource: String,
        domain: String,
    ) -> Deciding<Self::Decided>;

    fn verdict<B>(
        resource: String,
        decided: Self::Decided,
        grpc: bool,
        options: Options,
    ) -> Verdict<B>;
}

/// One resource and one domain per request, asked as kind `K`.
#[derive(Debug, Clone)]
pub struct PerResource<K, D = Header, R = Fixed> {
    kind: K,
    domain: D,
    resource: R,
    missing: MissingDomain,
}

impl<K: Kind> LimitLayer<PerResource<K>> {
    /// `resource` in `namespace` for every request, the domain from
    /// `x-tenant-id`.
    pub(super) fn per_resource(
        client: Client,
        namespace: &str,
        resource: impl Into<String>,
        kind: K,
    ) -> Self {
        Self::with_policy(
            client,
            namespace,
            PerResource {
                kind,
                domain: Header::default(),
                resource: Fixed::new(resource),
                missing: MissingDomain::default(),
            },
        )
    }
}

impl<K, D, R> LimitLayer<PerResource<K, D, R>> {
    pub(super) fn map_kind(self, change: impl FnOnce(K) -> K) -> Self {
        self.map_policy(|policy| PerResource {
            kind: change(policy.kind),
            ..policy
        })
    }

    /// Where the domain (tenant) comes from: a [`Header`],
    /// [`PeerAddr`](super::PeerAddr), [`ClientIp`](super::ClientIp), or a
    /// closure
    /// `Fn(&Request<B>) -> Option<String>`.
    pub fn domain<D2>(self, domain: D2) -> LimitLayer<PerResource<K, D2, R>> {
        self.map_policy(|policy| PerResource {
            kind: policy.kind,
            domain,
            resource: policy.resource,
            missing: policy.missing,
        })
    }

    /// Which resource a request is: [`Fixed`] (what `new` set),
    /// [`MethodAndRoute`](super::MethodAndRoute), or a closure
    /// `Fn(&Request<B>) -> String`.
    pub fn resource<R2>(self, resource: R2) -> LimitLayer<PerResource<K, D, R2>> {
        self.map_policy(|policy| PerResource {
            kind: policy.kind,
            domain: policy.domain,
            resource,
            missing: policy.missing,
        })
    }

    /// A request without a domain: one shared domain (default
    /// `anonymous`), or rejected with a status (400, 401).
    pub fn missing_domain(self, missing: MissingDomain) -> Self {
        self.map_policy(|policy| PerResource { missing, ..policy })
    }
}

impl<B, K, D, R> Policy<B> for PerResource<K, D, R>
where
    K: Kind,
    D: DomainOf<B>,
    R: ResourceOf<B>,
{
    type Asked = String;
    type Decided = K::Decided;

    fn ask(
        &self,
        client: &Client,
        namespace: &str,
        request: &Request<B>,
    ) -> Asked<String, K::Decided> {
        let domain = match resolve_domain(self.domain.domain_of(request), &self.missing) {
            Ok(domain) => domain,
            Err(status) => return Asked::Refuse(status, "missing or invalid domain"),
        };
        let resource = self.resource.resource_of(request);
        let deciding = self.kind.ask(client, namespace, resource.clone(), domain);
        Asked::Decide(resource, deciding)
    }

    fn verdict<RB>(
        &self,
        resource: String,
        decided: K::Decided,
        grpc: bool,
        options: Options,
    ) -> Verdict<RB> {
        K::verdict(resource, decided, grpc, options)
    }
}
