//! A Charon API session on the gRPC port: the stream of `SessionRequest`s
//! read, each parsed once into an operation and answered by the service's
//! [`Session`] as soon as it is decided (up to [`MAX_IN_FLIGHT`] at a time,
//! so one stream multiplexes), and the stream's end (the client's, the
//! sidecar's resignation, or shutdown) turned into the end of its waits and
//! the release of the hold set.

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use crate::api::v1::{SessionRequest, SessionResponse};
use crate::api::{answer_to_wire, operation_from_wire};
use crate::service::session::Session;

/// Operations of one session decided at once; past it, the session stops
/// reading until one is answered.
pub const MAX_IN_FLIGHT: usize = 64;

enum End {
    /// The client closed, went away, or broke the stream.
    Client,
    Resigned,
    Shutdown,
}

/// Serves `session` over one stream until it ends, then releases its holds
/// (unless the sidecar resigned: they are the reaper's then).
pub async fn run(
    session: Session,
    mut inbound: Streaming<SessionRequest>,
    outbound: mpsc::Sender<Result<SessionResponse, Status>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut membership = session.membership();
    let mut membership_open = true;
    let mut in_flight = FuturesUnordered::new();
    let mut reading = true;
    let end = loop {
        tokio::select! {
            message = inbound.message(), if reading && in_flight.len() < MAX_IN_FLIGHT => match message {
                Ok(Some(request)) => in_flight.push(answer(&session, request)),
                // Half-closed: the client still reads; answer what is in
                // flight, then end.
                Ok(None) => {
                    reading = false;
                    if in_flight.is_empty() {
                        break End::Client;
                    }
                }
                // Cancelled (RST_STREAM), the connection closed, or the
                // stream broken: nobody reads the answers.
                Err(_) => break End::Client,
            },
            Some(response) = in_flight.next() => {
                if outbound.send(Ok(response)).await.is_err() {
                    break End::Client;
                }
                if !reading && in_flight.is_empty() {
                    break End::Client;
                }
                if session.lost_holds(&membership.borrow()) {
                    break End::Resigned;
                }
            }
            changed = membership.changed(), if membership_open => {
                membership_open = changed.is_ok();
                if session.lost_holds(&membership.borrow_and_update()) {
                    break End::Resigned;
                }
            }
            _ = shutdown.changed() => break End::Shutdown,
            () = outbound.closed() => break End::Client,
        }
    };
    // Waits end now (a reserve waiting for copies is granted nothing);
    // operations already sent to the store finish (and land in the hold
    // set) before the hold set is released; their answers still go out if
    // the client listens (one answer per message).
    session.end();
    while let Some(response) = in_flight.next().await {
        let _ = outbound.send(Ok(response)).await;
    }
    drop(in_flight);
    match end {
        End::Resigned => {
            let _ = outbound
                .send(Err(Status::unavailable(
                    "this sidecar resigned from the copy log: its holds are released by the others; reconnect",
                )))
                .await;
        }
        End::Shutdown => {
            let _ = outbound
                .send(Err(Status::unavailable(
                    "this sidecar is shutting down: reconnect",
                )))
                .await;
            session.release_everything().await;
        }
        End::Client => session.release_everything().await,
    }
}

/// One message: parsed, answered, and the answer sent back with its id.
async fn answer(session: &Session, request: SessionRequest) -> SessionResponse {
    let result = match operation_from_wire(request.op) {
        Ok(op) => session.handle(op).await,
        Err((operation, error)) => Err(session.refused(operation, error)),
    };
    SessionResponse {
        id: request.id,
        result: Some(answer_to_wire(result)),
    }
}
