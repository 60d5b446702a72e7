//! The response body of every Charon layer: the service's own, or the
//! layer's short answer (429, 503). What a layer keeps until the response
//! is over rides along and is let go when the body ends or is dropped: the
//! concurrency layer's hold (a client that disconnects mid-response gives
//! its copy back), the throttle's slot ([`Permit`], with the cost the
//! request is measured or reported at), and a cost budget's settlement
//! (charged with what the response reported).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::client::Hold;

use super::settle::Settlement;
use super::throttle::Permit;

pin_project! {
    /// The body of a response that passed through a Charon layer.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        // Dropped (released) at the end of the body, or with it.
        hold: Option<Hold>,
        // Charged, likewise.
        settlement: Option<Settlement>,
        // The throttle's slot, given to the next request likewise.
        permit: Option<Permit>,
    }
}

pin_project! {
    #[project = KindProjection]
    enum Kind<B> {
        Service { #[pin] body: B },
        Layer { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(super) fn service(body: B, hold: Option<Hold>, settlement: Option<Settlement>) -> Self {
        Self {
            kind: Kind::Service { body },
            hold,
            settlement,
            permit: None,
        }
    }

    /// The service's body, holding a throttle's slot until it ends.
    pub(super) fn throttled(body: B, permit: Option<Permit>) -> Self {
        Self {
            kind: Kind::Service { body },
            hold: None,
            settlement: None,
            permit,
        }
    }

    /// Gives the throttle's slot back now, before the body ends: for a
    /// proxy that has read what it keeps of the answer and sends the rest
    /// at its client's pace.
    pub fn release_slot(self: Pin<&mut Self>) {
        self.project().permit.take();
    }

    pub(super) fn full(data: Bytes) -> Self {
        Self {
            kind: Kind::Layer {
                data: (!data.is_empty()).then_some(data),
            },
            hold: None,
            settlement: None,
            permit: None,
        }
    }

    pub(super) fn empty() -> Self {
        Self::full(Bytes::new())
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProjection::Service { body } => {
                let polled = body.poll_frame(cx);
                if let (Poll::Ready(Some(Ok(frame))), Some(settlement)) =
                    (&polled, this.settlement.as_ref())
                    && let Some(trailers) = frame.trailers_ref()
                {
                    settlement.read_trailers(trailers);
                }
                if let Poll::Ready(None) = polled {
                    // Fully sent: the copy is free now, and the cost
                    // charged, not when the connection gets around to
                    // dropping the body.
                    this.hold.take();
                    this.settlement.take();
                    this.permit.take();
                }
                polled
            }
            KindProjection::Layer { data } => {
                Poll::Ready(data.take().map(|data| Ok(Frame::data(data))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Service { body } => body.is_end_stream(),
            Kind::Layer { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Service { body } => body.size_hint(),
            Kind::Layer { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |data| data.len() as u64))
            }
        }
    }
}
