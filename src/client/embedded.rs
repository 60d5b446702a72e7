//! The embedded backend: the sidecar's own Charon API session, run in this
//! process on the memory store or on Redis (shared with sidecars and other
//! embedded engines), with no sidecar and no network hop. Same engine, same
//! answers, same hold sets as `charon serve`.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;

use arc_swap::ArcSwap;

use tokio::sync::{oneshot, watch};

use crate::api::v1::error::Kind as ErrorKind;
use crate::api::v1::session_request::Op;
use crate::api::v1::session_response::Result as Answer;
use crate::api::v1::{
    CostAnswer, CostRequest, GetCapacityRequest, GetCapacityResponse, ReleaseCapacityRequest,
    ReleaseCapacityResponse, RequestOp,
};
use crate::api::{answer_to_wire, capacity_response, operation_from_wire};
use crate::clock::SystemClock;
use crate::service::cost::CostOperation;

use crate::config::{Config, ConfigErrors, LoadOptions};
use crate::limiter::Modes;
use crate::service::configuration::Configuration;
use crate::service::error::Error;
use crate::service::ops::{GetCapacity, RateRequest, ReleaseCapacity};
use crate::service::session::Session;
use crate::service::{Service, Unobserved};
use crate::store::copies::{CopyTimings, TimingsError};
use crate::store::open::ConfigLogError;
use crate::store::open::OpenError;
use crate::store::open::{StoreOptions, Stores};

use super::backend::{
    Awaited, Backend, BackendFuture, CapacityFuture, LimitsFuture, NudgeStream, Reply, Unreachable,
    undo,
};
use super::{ClientError, LimitsAnswer};
use crate::limiter::{LimitError, RateLimitRequest};

/// Why an embedded engine did not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot open the store: {0}")]
    Store(#[from] OpenError),
    #[error(transparent)]
    Timings(#[from] TimingsError),
    #[error("invalid configuration:\n{0}")]
    Config(#[from] ConfigErrors),
    #[error("cannot open the configuration API's log: {0}")]
    ConfigLog(#[from] ConfigLogError),
}

/// The engine in this process, as one session.
pub struct Embedded {
    service: Arc<Service>,
    /// Replaced when the copy log says this engine resigned (its holds were
    /// reaped): the old session's holds are gone, a new one starts empty.
    session: ArcSwap<Session>,
    /// Bumped with every new session, so older hold guards release nothing.
    generation: AtomicU64,
    shutdown: watch::Sender<bool>,
}

impl Embedded {
    /// On the memory store: state lives and dies with this value. Spawns
    /// its housekeeping when called within a Tokio runtime.
    pub fn memory(config: Config) -> Self {
        Self::start(config, Stores::memory(crate::store::DEFAULT_MAX_KEYS))
    }

    /// On the store `options.url` names (`memory` or a Redis URL), with the
    /// sidecar's failure policy, heartbeat and reaper. Call within a Tokio
    /// runtime.
    pub async fn open(
        config: Config,
        options: &StoreOptions,
        timings: CopyTimings,
    ) -> Result<Self, EmbeddedError> {
        timings.validate()?;
        let stores = Stores::open(options, timings)?;
        stores.rate.settle().await;
        Ok(Self::start(config, stores))
    }

    /// On the configuration files at `path` (a file or a directory) and
    /// the store `options.url` names, with the configuration API
    /// ([`Embedded::configuration`]): its objects live in the store's log,
    /// on Redis the one every sidecar on it shares (so a change made through
    /// any of them applies here within a second), in memory this engine's
    /// own (kept in `config_state` when given). Call within a Tokio runtime.
    pub async fn open_files(
        path: &Path,
        load: LoadOptions,
        options: &StoreOptions,
        timings: CopyTimings,
        config_state: Option<&Path>,
    ) -> Result<Self, EmbeddedError> {
        timings.validate()?;
        let stores = Stores::open(options, timings)?;
        stores.rate.settle().await;
        let log = stores.config_log(options, config_state)?;
        let configuration = Configuration::open(path.to_owned(), load, log).await?;
        let service = Service::on_configuration(
            Arc::new(configuration),
            stores,
            Modes::default(),
            Arc::new(Unobserved),
            Arc::new(SystemClock),
        );
        Ok(Self::run(service))
    }

    fn start(config: Config, stores: Stores) -> Self {
        Self::run(Service::new(
            config,
            stores,
            Modes::default(),
            Arc::new(Unobserved),
            Arc::new(SystemClock),
        ))
    }

    fn run(service: Service) -> Self {
        let service = Arc::new(service);
        let (shutdown, stop) = watch::channel(false);
        if tokio::runtime::Handle::try_current().is_ok() {
            service.spawn_housekeeping(stop);
        }
        Self {
            session: ArcSwap::from_pointee(Session::new(service.clone())),
            generation: AtomicU64::new(0),
            service,
            shutdown,
        }
    }

    /// Replaces the configuration (as a sidecar's reload does).
    pub fn replace_config(&self, config: Config) {
        self.service.replace_config(config);
    }

    /// The service this engine runs: its configuration, stores and leases.
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// The configuration API of an engine opened on files
    /// ([`Embedded::open_files`]): per-domain overrides and namespaces,
    /// checked like a file, written to the log and applied whole.
    pub fn configuration(&self) -> Option<&Arc<Configuration>> {
        self.service.configuration.as_ref()
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if self.service.copies.is_shared()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Shared holds must not outlive this engine.
            let session = self.session.load_full();
            let copies = self.service.copies.clone();
            runtime.spawn(async move {
                session.release_everything().await;
                copies.deregister().await;
            });
        }
    }
}

impl Backend for Embedded {
    fn call(&self, op: Op) -> BackendFuture<'_> {
        let session = self.session.load_full();
        let generation = self.generation.load(Ordering::Acquire);
        Box::pin(async move {
            let reserve = match &op {
                Op::Reserve(reserve) => Some(reserve.clone()),
                _ => None,
            };
            let mut work = Box::pin(answer(session.clone(), op));
            // The memory store decides within the first poll: no task then.
            let first = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
            let result = match first {
                Poll::Ready(result) => result,
                Poll::Pending => {
                    let runtime = tokio::runtime::Handle::try_current()
                        .map_err(|_| Unreachable("no Tokio runtime to run the engine on".into()))?;
                    // Finished on its own task, so a caller that gives up
                    // cannot cut an operation in half; a grant nobody
                    // receives is undone.
                    let (sender, receiver) = oneshot::channel();
                    let undoing = session.clone();
                    let late = reserve.clone();
                    runtime.spawn(async move {
                        let result = work.await;
                        if let Err(result) = sender.send(result)
                            && let Some(undo) = undo(late.as_ref(), &result)
                        {
                            let _ = answer(undoing, undo).await;
                        }
                    });
                    let undoing = session.clone();
                    let answered = Awaited::new(receiver, move |result| {
                        if let (Some(undo), Ok(runtime)) = (
                            undo(reserve.as_ref(), &result),
                            tokio::runtime::Handle::try_current(),
                        ) {
                            runtime.spawn(answer(undoing, undo));
                        }
                    });
                    answered
                        .answer()
                        .await
                        .ok_or_else(|| Unreachable("the embedded engine stopped".into()))?
                }
            };
            if let Answer::Error(error) = &result
                && error.kind == ErrorKind::Resigned as i32
            {
                self.renew(&session);
            }
            Ok(Reply {
                answer: result,
                session: generation,
            })
        })
    }

    fn request(&self, op: RequestOp) -> BackendFuture<'_> {
        // The hot path of the rate layer: straight to the service, no session
        // message and no task (hits are never undone, so a caller that
        // gives up needs nothing finished for it).
        Box::pin(async move {
            let answer = match RateRequest::try_from(op) {
                Ok(op) => self
                    .service
                    .request(&op)
                    .await
                    .map(crate::service::ops::Answer::Request),
                Err(error) => Err(error),
            };
            let answer = answer_to_wire(answer);
            Ok(Reply {
                answer,
                session: self.generation.load(Ordering::Acquire),
            })
        })
    }

    fn should_rate_limit(&self, request: RateLimitRequest) -> LimitsFuture<'_> {
        // Hits cannot be given back, so a caller that gives up may leave
        // them counted or not: no task and no undo, unlike a reserve.
        Box::pin(async move {
            let answer = self.service.limiter.should_rate_limit(request).await;
            answer
                .map(|answer| LimitsAnswer::from(&answer))
                .map_err(limit_error)
        })
    }

    fn check<'a>(&'a self, request: &'a RateLimitRequest) -> LimitsFuture<'a> {
        // By reference: the caller keeps the request to charge it later,
        // and no copy of its descriptors is made.
        Box::pin(async move {
            let answer = self.service.limiter.check(request).await;
            answer
                .map(|answer| LimitsAnswer::from(&answer))
                .map_err(limit_error)
        })
    }

    fn charge(&self, request: RateLimitRequest) -> CapacityFuture<'_, ()> {
        // No statuses to build: nobody reads them.
        Box::pin(async move {
            let recorded = self.service.limiter.record(request).await;
            recorded.map(drop).map_err(limit_error)
        })
    }

    fn charge_now(&self, request: &RateLimitRequest) -> Option<Result<(), ClientError>> {
        let recorded = self.service.limiter.record_now(request)?;
        Some(recorded.map(drop).map_err(limit_error))
    }

    fn get_capacity(&self, request: GetCapacityRequest) -> CapacityFuture<'_, GetCapacityResponse> {
        Box::pin(async move {
            let request = GetCapacity::try_from(request).map_err(client_error)?;
            Ok(capacity_response(self.service.get_capacity(&request).await))
        })
    }

    fn watch_capacity(&self, client_id: String) -> CapacityFuture<'_, NudgeStream> {
        let watched = self
            .service
            .leases
            .nudges
            .watch(&client_id)
            .map_err(client_error)
            .map(|nudges| {
                let nudges = futures_util::stream::unfold(nudges, |mut nudges| async move {
                    nudges.changed().await.ok()?;
                    Some((Ok(()), nudges))
                });
                Box::pin(nudges) as NudgeStream
            });
        Box::pin(std::future::ready(watched))
    }

    fn release_capacity(
        &self,
        request: ReleaseCapacityRequest,
    ) -> CapacityFuture<'_, ReleaseCapacityResponse> {
        Box::pin(async move {
            let request = ReleaseCapacity::try_from(request).map_err(client_error)?;
            let released = self
                .service
                .release_capacity(&request)
                .await
                .map_err(client_error)?;
            Ok(ReleaseCapacityResponse { released })
        })
    }

    fn cost(&self, request: CostRequest) -> CapacityFuture<'_, CostAnswer> {
        Box::pin(async move {
            let operation = CostOperation::try_from(request).map_err(client_error)?;
            let reply = self.service.cost(operation).await.map_err(client_error)?;
            Ok(reply.into())
        })
    }

    fn session(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

impl Embedded {
    /// After a resignation every operation of the old session answers
    /// RESIGNED: start a new one (once, whoever notices first).
    fn renew(&self, resigned: &Arc<Session>) {
        let fresh = Arc::new(Session::new(self.service.clone()));
        let previous = self.session.compare_and_swap(resigned, fresh);
        if Arc::ptr_eq(&previous, resigned) {
            self.generation.fetch_add(1, Ordering::AcqRel);
            tracing::warn!("the embedded engine resigned from the copy log: new session");
        }
    }
}

/// `op`, parsed as the gRPC face parses it, answered by the session.
async fn answer(session: Arc<Session>, op: Op) -> Answer {
    let result = match operation_from_wire(Some(op)) {
        Ok(op) => session.handle(op).await,
        Err((operation, error)) => Err(session.refused(operation, error)),
    };
    answer_to_wire(result)
}

/// The service's refusal as the client reports it: the server's trouble
/// (fail open), or the request's fault with its kind, as the wire says it.
/// A refused request is the caller's to fix; a store that failed is a
/// server error (the client fails open).
fn limit_error(error: LimitError) -> ClientError {
    match error {
        LimitError::InvalidArgument(message) => ClientError::Invalid(message),
        LimitError::Store(error) => ClientError::Unavailable(error.to_string()),
    }
}

fn client_error(error: Error) -> ClientError {
    if error.is_server_error() {
        ClientError::Unavailable(error.message)
    } else {
        ClientError::Refused {
            kind: error.kind.into(),
            message: error.message,
        }
    }
}
