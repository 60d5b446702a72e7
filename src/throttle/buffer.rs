//! The buffers between a client and its slot (docs/design.md#the-throttling-sidecar).
//!
//! A request's body is read whole, up to a bound and under a timeout,
//! before the request queues ([`read_request`]): a client that sends its
//! body slowly waits on its own connection and takes no slot, and a
//! request the proxy forwards is complete, so the upstream never waits on
//! a client either. Past the bound it is 413, past the timeout 408.
//!
//! The upstream's answer is read as fast as the upstream sends it, into a
//! buffer of the same bound the client drains at its own pace
//! ([`read_ahead`]): the slot is given back once the whole answer is in,
//! not once the client has read it. An answer larger than the bound keeps
//! its slot until the buffer fills, then gives it back and streams the rest
//! at the client's pace (its writes bounded by the connection's write
//! timeout). Frames pass as they come, so a streamed answer still streams.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError, mpsc};

use super::forward::{Buffered, ProxyBody, own_answer};
use super::protect::{Protection, ProtectionCounts, Reason};
use crate::layer::ResponseBody;

/// Reads `request`'s body whole under `protection`'s bound and timeout;
/// the proxy's own answer if it cannot.
pub async fn read_request<B>(
    request: Request<B>,
    protection: &Protection,
    counts: &ProtectionCounts,
) -> Result<Request<Buffered>, Response<ProxyBody>>
where
    B: Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let bound = protection.max_buffered_body;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > bound as u64) {
        // Refused before a byte of it is read.
        counts.count(Reason::BodyTooLarge);
        return Err(too_large());
    }
    let (parts, body) = request.into_parts();
    let read = Limited::new(body, bound).collect();
    let body = match tokio::time::timeout(protection.request_body_timeout, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) if error.is::<LengthLimitError>() => {
            counts.count(Reason::BodyTooLarge);
            return Err(too_large());
        }
        Ok(Err(_)) => {
            return Err(closing(own_answer(
                StatusCode::BAD_REQUEST,
                "the request body did not arrive whole",
            )));
        }
        Err(_) => {
            counts.count(Reason::BodyTimeout);
            return Err(closing(own_answer(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
            )));
        }
    };
    Ok(Request::from_parts(parts, Full::new(body)))
}

fn too_large() -> Response<ProxyBody> {
    closing(own_answer(
        StatusCode::PAYLOAD_TOO_LARGE,
        "the request body is larger than the proxy buffers",
    ))
}

/// An answer after which the connection closes: the rest of the request
/// body is not read.
fn closing(mut response: Response<ProxyBody>) -> Response<ProxyBody> {
    response
        .headers_mut()
        .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    response
}

/// The answer `response` (its body holding a throttle's slot), read ahead
/// of the client on a task of its own, up to `bound` bytes.
pub fn read_ahead<B>(
    response: Response<ResponseBody<B>>,
    bound: usize,
    counts: Arc<ProtectionCounts>,
) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let (parts, body) = response.into_parts();
    let size_hint = body.size_hint();
    let bound = bound.clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    let room = Arc::new(Semaphore::new(bound));
    let (sender, frames) = mpsc::unbounded_channel();
    tokio::spawn(pump(body, bound, room.clone(), sender, counts));
    let body = ReadAhead {
        frames,
        room,
        size_hint,
    };
    Response::from_parts(parts, body.boxed())
}

type Item = Result<(Frame<Bytes>, Option<OwnedSemaphorePermit>), ProxyError>;
type ProxyError = Box<dyn std::error::Error + Send + Sync>;

/// Moves the upstream's frames into the buffer while it has room; gives
/// the slot back when the body ends (dropped) or the buffer first fills.
async fn pump<B>(
    body: ResponseBody<B>,
    bound: usize,
    room: Arc<Semaphore>,
    sender: mpsc::UnboundedSender<Item>,
    counts: Arc<ProtectionCounts>,
) where
    B: Body<Data = Bytes>,
    B::Error: Into<ProxyError> + Send,
{
    let mut body = std::pin::pin!(body);
    let mut released = false;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                let _ = sender.send(Err(error.into()));
                return;
            }
        };
        let size = frame.data_ref().map_or(0, Bytes::len);
        // A frame larger than the whole buffer takes all of it.
        let wanted = u32::try_from(size.min(bound)).unwrap_or(u32::MAX);
        let permit = if size == 0 {
            None
        } else {
            match room.clone().try_acquire_many_owned(wanted) {
                Ok(permit) => Some(permit),
                Err(TryAcquireError::Closed) => return,
                Err(TryAcquireError::NoPermits) => {
                    if !released {
                        // Larger than the buffer: the rest goes at the
                        // client's pace, and the slot to the next request.
                        body.as_mut().release_slot();
                        released = true;
                        counts.count(Reason::ResponseStreamed);
                    }
                    match room.clone().acquire_many_owned(wanted).await {
                        Ok(permit) => Some(permit),
                        Err(_) => return,
                    }
                }
            }
        };
        if sender.send(Ok((frame, permit))).is_err() {
            return;
        }
    }
}

/// The client's side of the buffer.
struct ReadAhead {
    frames: mpsc::UnboundedReceiver<Item>,
    room: Arc<Semaphore>,
    size_hint: SizeHint,
}

impl Body for ReadAhead {
    type Data = Bytes;
    type Error = ProxyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ProxyError>>> {
        // The frame's room is free once it is handed to the connection.
        Poll::Ready(match std::task::ready!(self.frames.poll_recv(cx)) {
            Some(Ok((frame, _room))) => Some(Ok(frame)),
            Some(Err(error)) => Some(Err(error)),
            None => None,
        })
    }

    fn size_hint(&self) -> SizeHint {
        self.size_hint
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // The client is gone: the pump stops, dropping the upstream's body
        // (and its slot, if it still holds one).
        self.room.close();
    }
}
