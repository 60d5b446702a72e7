//! [`DescriptorLimitLayer`]: each request decided as an Envoy-style request
//! in the layer's namespace, by the descriptors its [`DescriptorsOf`]
//! builds: the limits of a `descriptors:` tree (and the `resource:` leaves
//! in it) applied in process, several at once, all or nothing
//! (docs/design.md#all-or-nothing). [`Actions`] builds descriptors as
//! Envoy's route `rate_limits` actions do; a closure builds anything else.

use std::future::Future;

use http::header::HeaderName;
use http::{Request, StatusCode};

use crate::client::{Client, ClientError, LimitStatus, LimitsAnswer};
use crate::limiter::{Descriptor, RateLimitRequest};

use super::PeerAddr;
use super::key::DomainOf;
use super::limit::{Limit, LimitLayer};
use super::policy::{Asked, Options, Policy};
use super::policy::{Extra, Verdict};
use super::reply::{self, Quota};

/// Applies the limits of a namespace's descriptors to every request: the
/// descriptors `F` builds, decided together; when any is over its limit,
/// nothing is counted and the request gets a 429 (gRPC
/// `RESOURCE_EXHAUSTED`).
pub type DescriptorLimitLayer<F = Actions> = LimitLayer<PerDescriptors<F>>;

/// The service of [`DescriptorLimitLayer`].
pub type DescriptorLimit<S, F = Actions> = Limit<S, PerDescriptors<F>>;

impl<F> DescriptorLimitLayer<F> {
    /// The descriptors `descriptors` builds from each request, in
    /// `namespace`.
    pub fn new(client: Client, namespace: &str, descriptors: F) -> Self {
        Self::with_policy(client, namespace, PerDescriptors(descriptors))
    }
}

/// The descriptors of a request; none: the request is not limited.
pub trait DescriptorsOf<B>: Send + Sync + 'static {
    fn descriptors_of(&self, request: &Request<B>) -> Vec<Descriptor>;
}

impl<B, F> DescriptorsOf<B> for F
where
    F: Fn(&Request<B>) -> Vec<Descriptor> + Send + Sync + 'static,
{
    fn descriptors_of(&self, request: &Request<B>) -> Vec<Descriptor> {
        self(request)
    }
}

/// One entry of a descriptor, as an Envoy route's rate-limit action makes
/// it.
#[derive(Debug, Clone)]
pub enum Action {
    /// `generic_key`: a fixed entry.
    GenericKey { key: String, value: String },
    /// `request_headers`: the header's value under `key`. A request without
    /// the header gets no such descriptor (as in Envoy).
    RequestHeader { header: HeaderName, key: String },
    /// `remote_address`: the client's IP under `remote_address` (see
    /// [`PeerAddr`] for where it comes from).
    RemoteAddress,
}

impl Action {
    /// Envoy's `generic_key` action: `("generic_key", value)`.
    pub fn generic_key(value: impl Into<String>) -> Self {
        Action::GenericKey {
            key: "generic_key".into(),
            value: value.into(),
        }
    }

    /// Envoy's `request_headers` action: `(key, value of header)`.
    pub fn request_header(header: HeaderName, key: impl Into<String>) -> Self {
        Action::RequestHeader {
            header,
            key: key.into(),
        }
    }

    /// The entry, or `None` when the request lacks what it needs.
    fn entry<B>(&self, request: &Request<B>) -> Option<(String, String)> {
        match self {
            Action::GenericKey { key, value } => Some((key.clone(), value.clone())),
            Action::RequestHeader { header, key } => {
                let value = request.headers().get(header)?.to_str().ok()?;
                Some((key.clone(), value.to_owned()))
            }
            Action::RemoteAddress => Some(("remote_address".into(), PeerAddr.domain_of(request)?)),
        }
    }
}

/// Descriptors built as Envoy's `rate_limits` build them: each a list of
/// actions, one entry per action; a descriptor whose action finds nothing
/// in the request is left out.
///
/// ```
/// use charon::layer::{Action, Actions};
/// use http::HeaderName;
/// // Envoy: rate_limits: [{actions: [{generic_key: {descriptor_value: api}},
/// //   {request_headers: {header_name: x-tenant-id, descriptor_key: tenant}}]}]
/// let actions = Actions::new().descriptor([
///     Action::generic_key("api"),
///     Action::request_header(HeaderName::from_static("x-tenant-id"), "tenant"),
/// ]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Actions {
    descriptors: Vec<Vec<Action>>,
}

impl Actions {
    pub fn new() -> Self {
        Self::default()
    }

    /// One more descriptor, its entries made by `actions` in order.
    pub fn descriptor(mut self, actions: impl IntoIterator<Item = Action>) -> Self {
        self.descriptors.push(actions.into_iter().collect());
        self
    }
}

impl<B> DescriptorsOf<B> for Actions {
    fn descriptors_of(&self, request: &Request<B>) -> Vec<Descriptor> {
        self.descriptors
            .iter()
            .filter_map(|actions| {
                let entries = actions
                    .iter()
                    .map(|action| action.entry(request))
                    .collect::<Option<Vec<_>>>()?;
                (!entries.is_empty()).then(|| Descriptor {
                    entries,
                    ..Descriptor::default()
                })
            })
            .collect()
    }
}

/// The policy of [`DescriptorLimitLayer`].
#[derive(Debug, Clone)]
pub struct PerDescriptors<F>(F);

impl<B, F: DescriptorsOf<B>> Policy<B> for PerDescriptors<F> {
    /// Each descriptor's name in the quota headers: its keys.
    type Asked = Vec<String>;
    type Decided = Result<LimitsAnswer, ClientError>;

    fn ask(
        &self,
        client: &Client,
        namespace: &str,
        request: &Request<B>,
    ) -> Asked<Self::Asked, Self::Decided> {
        let descriptors = self.0.descriptors_of(request);
        if descriptors.is_empty() {
            return Asked::Pass;
        }
        let names = descriptors.iter().map(keys).collect();
        let client = client.clone();
        let request = RateLimitRequest::new(namespace, descriptors);
        Asked::Decide(
            names,
            boxed(async move { client.should_rate_limit(request).await }),
        )
    }

    fn verdict<R>(
        &self,
        names: Vec<String>,
        answer: Self::Decided,
        grpc: bool,
        options: Options,
    ) -> Verdict<R> {
        verdict(&names, answer, grpc, options)
    }
}

/// What a descriptors answer makes of a request (the descriptor and cost
/// layers' verdict); `names` name each descriptor in the quota headers.
pub(super) fn verdict<R>(
    names: &[String],
    answer: Result<LimitsAnswer, ClientError>,
    grpc: bool,
    options: Options,
) -> Verdict<R> {
    match answer {
        Ok(answer) if answer.unanswered && options.fail_closed => {
            Verdict::Answer(reply::unavailable(grpc))
        }
        Ok(answer) if !answer.is_granted() => {
            // The limit the request waits longest for.
            let binding = tightest(names, &answer, |status| {
                status
                    .over_limit
                    .then(|| status.reset_after.unwrap_or_default())
            });
            let mut refusal =
                reply::rejected(grpc, "rate_limited", answer.retry_after(), binding.as_ref());
            if options.every_descriptor_headers
                && let Some(binding) = &binding
            {
                Quota::write_every(&every(names, &answer), binding, refusal.headers_mut());
            }
            Verdict::Exceeded {
                retry_after: answer.retry_after(),
                refusal,
            }
        }
        Ok(_) if !options.granted_headers => Verdict::Pass(Extra::default()),
        Ok(answer) => Verdict::Pass(Extra {
            // The limit closest to biting.
            quota: tightest(names, &answer, |status| {
                Some(std::cmp::Reverse(status.remaining))
            }),
            policies: if options.every_descriptor_headers {
                every(names, &answer)
            } else {
                Vec::new()
            },
            ..Extra::default()
        }),
        Err(ClientError::Invalid(message)) => {
            Verdict::Answer(reply::failed(grpc, StatusCode::BAD_REQUEST, &message))
        }
        Err(error) => match reply::refused(grpc, &error, options.fail_closed) {
            Some(response) => Verdict::Answer(response),
            None => Verdict::Pass(Extra::default()),
        },
    }
}

pub(super) fn boxed<T>(
    future: impl Future<Output = T> + Send + 'static,
) -> std::pin::Pin<Box<dyn Future<Output = T> + Send>> {
    Box::pin(future)
}

/// A descriptor's keys, `tenant.path`: its name where its limit has none.
pub(super) fn keys(descriptor: &Descriptor) -> String {
    let mut name = String::new();
    for (index, (key, _)) in descriptor.entries.iter().enumerate() {
        if index > 0 {
            name.push('.');
        }
        name.push_str(key);
    }
    name
}

/// Every limited status's quota, in the request's order.
fn every(names: &[String], answer: &LimitsAnswer) -> Vec<Quota> {
    names
        .iter()
        .zip(&answer.statuses)
        .filter_map(|(name, status)| quota(name, status))
        .collect()
}

fn quota(name: &str, status: &LimitStatus) -> Option<Quota> {
    let limit = status.limit.as_ref()?;
    Some(Quota {
        name: limit.name.clone().unwrap_or_else(|| name.to_owned()),
        limit: limit.requests_per_unit,
        window: Some(limit.window),
        remaining: status.remaining,
        reset: status.reset_after,
    })
}

/// The quota of the limited status that `rank` puts highest (`None`: not
/// a candidate).
fn tightest<K: Ord>(
    names: &[String],
    answer: &LimitsAnswer,
    rank: impl Fn(&LimitStatus) -> Option<K>,
) -> Option<Quota> {
    let (name, status) = names
        .iter()
        .zip(&answer.statuses)
        .filter(|(_, status)| status.limit.is_some())
        .filter_map(|(name, status)| Some((rank(status)?, name, status)))
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, name, status)| (name, status))?;
    quota(name, status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_build_descriptors_as_envoy_does() {
        let tenant = HeaderName::from_static("x-tenant-id");
        let actions = Actions::new()
            .descriptor([
                Action::generic_key("api"),
                Action::request_header(tenant, "tenant"),
            ])
            .descriptor([Action::RemoteAddress])
            .descriptor([Action::generic_key("everyone")]);
        let with_tenant = Request::builder()
            .header("x-tenant-id", "acme")
            .body(())
            .unwrap();
        let built = actions.descriptors_of(&with_tenant);
        let entries: Vec<_> = built.iter().map(|d| d.entries.clone()).collect();
        // No peer address known: that descriptor is left out, as is one
        // whose header is missing.
        assert_eq!(
            entries,
            [
                vec![
                    ("generic_key".to_owned(), "api".to_owned()),
                    ("tenant".to_owned(), "acme".to_owned())
                ],
                vec![("generic_key".to_owned(), "everyone".to_owned())],
            ]
        );
        let without = Request::builder().body(()).unwrap();
        assert_eq!(actions.descriptors_of(&without).len(), 1);
        assert_eq!(keys(&built[0]), "generic_key.tenant");
    }
}
