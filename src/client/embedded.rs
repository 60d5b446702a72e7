//! The embedded backend: the sidecar's own Charon API session, run in this
//! process on the memory store or on Redis (shared with sidecars and other
//! embedded engines), with no sidecar and no network hop. Same engine, same
//! answers, same hold sets as `charon serve`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;

use arc_swap::ArcSwap;

use tokio::sync::{oneshot, watch};

use crate::api::v1::error::Kind as ErrorKind;
use crate::api::v1::session_request::Op;
use crate::api::v1::session_response::Result as Answer;
use crate::api::v1::{
    Error as WireError, GetCapacityRequest, GetCapacityResponse, ReleaseCapacityRequest,
    ReleaseCapacityResponse, RequestOp, SessionRequest,
};
use crate::config::Config;
use crate::limiter::Modes;
use crate::service::core::ApiError;
use crate::service::session::Session;
use crate::service::store::{StoreOptions, Stores};
use crate::service::{Service, Unobserved};
use crate::store::RedisError;
use crate::store::copies::{CopyStore, CopyTimings, TimingsError};

use super::backend::{
    Awaited, Backend, BackendFuture, CapacityFuture, LimitsFuture, Reply, Unreachable, undo,
};
use super::{ClientError, LimitsAnswer};
use crate::limiter::{LimitError, RateLimitRequest};

/// Why an embedded engine did not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot open the store: {0}")]
    Store(#[from] RedisError),
    #[error(transparent)]
    Timings(#[from] TimingsError),
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
        let stores = Stores {
            rate: crate::service::store::SidecarStore::Memory(crate::store::MemoryStore::new()),
            copies: CopyStore::Memory(crate::store::copies::MemoryCopies::new()),
            leases: crate::store::leases::LeaseStore::Memory(
                crate::store::leases::MemoryLeases::new(),
            ),
        };
        Self::start(config, stores)
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

    fn start(config: Config, stores: Stores) -> Self {
        let service = Arc::new(Service::new(
            config,
            stores,
            Modes::default(),
            Arc::new(Unobserved),
        ));
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
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let CopyStore::Redis(redis) = &*self.service.copies
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Shared holds must not outlive this engine.
            let session = self.session.load_full();
            let redis = redis.clone();
            runtime.spawn(async move {
                session.release_everything().await;
                redis.deregister().await;
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
            let answer = match self.service.request(&op).await {
                Ok(answer) => Answer::Request(answer),
                Err(error) => Answer::Error(error.into_wire()),
            };
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
            match self.service.limiter.should_rate_limit(request).await {
                Ok(answer) => Ok(LimitsAnswer::from(&answer)),
                Err(LimitError::InvalidArgument(message)) => Err(ClientError::Invalid(message)),
                Err(LimitError::Store(error)) => Err(ClientError::Unavailable(error.to_string())),
            }
        })
    }

    fn get_capacity(&self, request: GetCapacityRequest) -> CapacityFuture<'_, GetCapacityResponse> {
        Box::pin(async move {
            self.service
                .get_capacity(&request)
                .await
                .map_err(client_error)
        })
    }

    fn release_capacity(
        &self,
        request: ReleaseCapacityRequest,
    ) -> CapacityFuture<'_, ReleaseCapacityResponse> {
        Box::pin(async move {
            self.service
                .release_capacity(&request)
                .await
                .map_err(client_error)
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

async fn answer(session: Arc<Session>, op: Op) -> Answer {
    let response = session
        .handle(SessionRequest {
            id: 0,
            op: Some(op),
        })
        .await;
    response.result.unwrap_or_else(|| {
        Answer::Error(WireError {
            message: "no answer".into(),
            ..WireError::default()
        })
    })
}

/// The service's refusal as the client reports it: the server's trouble
/// (fail open) or the request's fault.
fn client_error(error: ApiError) -> ClientError {
    if error.is_server_error() {
        ClientError::Unavailable(error.message)
    } else {
        ClientError::Invalid(error.message)
    }
}
