//! Framed streams and the hello exchange that opens every stream.
//!
//! Frames are `flotilla_proto::frame`'s: a 4-byte length checked against a
//! limit before anything is allocated, then an rkyv archive validated before
//! it is read. A peer that violates either gets a typed error and its
//! connection is closed by the caller.

use flotilla_proto::frame::{self, FrameError, PREFIX_LEN};
use flotilla_proto::hello::{
    CookieDigest, Hello, HelloReply, Purpose, Refusal, check_hello, check_incarnation,
};
use flotilla_proto::ids::MemberName;
use flotilla_proto::incarnation::Incarnation;
use flotilla_proto::role::Role;
use flotilla_proto::wire::{self, Decode, Encode, WireError};
use quinn::{RecvStream, SendStream};

use crate::closing::Closing;

/// Why a framed exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// The peer sent a frame over the limit or cut one short.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The peer sent an archive that fails validation.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The peer refused our hello.
    #[error("refused by peer: {0}")]
    Refused(Refusal),
    /// We refused the peer's hello.
    #[error("refused peer: {0}")]
    RefusedPeer(Refusal),
    /// The peer opened a stream but sent no hello in time.
    #[error("NODE-WIRE-005: no hello within {0:?} of the stream opening")]
    HelloTimeout(std::time::Duration),
    /// The connection or stream failed.
    #[error("stream failed: {0}")]
    Io(#[from] IoError),
    /// The peer closed the connection, saying why.
    #[error(transparent)]
    ClosedByPeer(Closing),
}

/// How a QUIC connection or stream failed under a framed exchange.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The connection is gone (closed, timed out, reset).
    #[error(transparent)]
    Connection(#[from] quinn::ConnectionError),
    /// Writing failed.
    #[error(transparent)]
    Write(#[from] quinn::WriteError),
    /// Reading failed.
    #[error(transparent)]
    Read(#[from] quinn::ReadError),
    /// The stream was already finished or reset.
    #[error(transparent)]
    Closed(#[from] quinn::ClosedStream),
}

impl StreamError {
    /// Why to close the connection after this failure.
    pub fn closing(&self) -> Closing {
        match self {
            Self::Frame(_) => Closing::MalformedFrame,
            Self::Wire(_) => Closing::MalformedArchive,
            Self::Refused(_) | Self::RefusedPeer(_) => Closing::Refused,
            Self::Io(_) | Self::ClosedByPeer(_) => Closing::BrokenStream,
            Self::HelloTimeout(_) => Closing::HelloTimeout,
        }
    }

    /// Whether the connection itself is gone (nothing left to close).
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Io(_) | Self::ClosedByPeer(_))
    }
}

impl IoError {
    /// The connection failure under this one, if it is one.
    fn connection(&self) -> Option<&quinn::ConnectionError> {
        match self {
            Self::Connection(e)
            | Self::Write(quinn::WriteError::ConnectionLost(e))
            | Self::Read(quinn::ReadError::ConnectionLost(e)) => Some(e),
            _ => None,
        }
    }
}

/// A failed read or write, named by the peer's reason where it closed the
/// connection with one.
fn io(e: impl Into<IoError>) -> StreamError {
    let e = e.into();
    match e.connection().and_then(Closing::of) {
        Some(why) => StreamError::ClosedByPeer(why),
        None => StreamError::Io(e),
    }
}

/// Writes `bytes` to `send` whole.
pub async fn write_all(send: &mut SendStream, bytes: &[u8]) -> Result<(), StreamError> {
    send.write_all(bytes).await.map_err(io)
}

/// Writes one framed archive.
pub async fn send_msg<T: Encode>(
    send: &mut SendStream,
    msg: &T,
    max: u32,
) -> Result<(), StreamError> {
    let bytes = frame::encode(&wire::encode(msg), max)?;
    write_all(send, &bytes).await
}

/// Where frames are read from: a QUIC stream, or any source of byte
/// chunks ([`read_frame`] is the one reader of both).
pub trait FrameSource {
    /// How reading fails.
    type Error;

    /// The next chunk of at most `max` bytes (`max` > 0), `None` at the
    /// end of the stream.
    fn read_chunk(
        &mut self,
        max: usize,
    ) -> impl std::future::Future<Output = Result<Option<bytes::Bytes>, Self::Error>> + Send;
}

impl FrameSource for RecvStream {
    type Error = quinn::ReadError;

    async fn read_chunk(&mut self, max: usize) -> Result<Option<bytes::Bytes>, quinn::ReadError> {
        Ok(RecvStream::read_chunk(self, max, true)
            .await?
            .map(|c| c.bytes))
    }
}

/// Why [`read_frame`] read no frame.
#[derive(Debug, thiserror::Error)]
pub enum ReadFrameError<E> {
    /// The frame was over the limit or cut short.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The source failed.
    #[error("reading failed")]
    Source(E),
}

/// Payload bytes reserved before any has arrived; past them the buffer
/// grows with what arrives (at most doubling), so a prefix that claims
/// more than is sent reserves no more than what is sent.
const FIRST_RESERVE: usize = 16 << 10;

/// Reads one frame's payload from `source`, checking its length before
/// allocating anything and growing the buffer only with the bytes that
/// arrive. `Ok(None)` on a clean end of stream between frames.
pub async fn read_frame<S: FrameSource>(
    source: &mut S,
    max: u32,
) -> Result<Option<Vec<u8>>, ReadFrameError<S::Error>> {
    let mut prefix = [0u8; PREFIX_LEN];
    let mut got = 0;
    while got < PREFIX_LEN {
        match source
            .read_chunk(PREFIX_LEN - got)
            .await
            .map_err(ReadFrameError::Source)?
        {
            Some(chunk) => {
                prefix[got..got + chunk.len()].copy_from_slice(&chunk);
                got += chunk.len();
            }
            None if got == 0 => return Ok(None),
            None => {
                return Err(FrameError::Truncated {
                    got,
                    want: PREFIX_LEN,
                }
                .into());
            }
        }
    }
    let len = frame::payload_len(prefix, max)?;
    // Chunks are appended as they come: the buffer is written once, never
    // zeroed first (a bulk frame is megabytes).
    let mut payload = Vec::with_capacity(len.min(FIRST_RESERVE));
    while payload.len() < len {
        match source
            .read_chunk(len - payload.len())
            .await
            .map_err(ReadFrameError::Source)?
        {
            Some(chunk) => payload.extend_from_slice(&chunk),
            None => {
                return Err(FrameError::Truncated {
                    got: payload.len(),
                    want: len,
                }
                .into());
            }
        }
    }
    Ok(Some(payload))
}

/// Reads one frame's payload from a QUIC stream ([`read_frame`]).
/// `Ok(None)` on a clean end of stream between frames.
pub async fn recv_frame(recv: &mut RecvStream, max: u32) -> Result<Option<Vec<u8>>, StreamError> {
    read_frame(recv, max).await.map_err(|e| match e {
        ReadFrameError::Frame(e) => e.into(),
        ReadFrameError::Source(e) => io(e),
    })
}

/// Reads and validates one framed archive; end of stream is an error.
pub async fn recv_msg<T: Decode>(recv: &mut RecvStream, max: u32) -> Result<T, StreamError> {
    let payload = recv_frame(recv, max).await?.ok_or(FrameError::Truncated {
        got: 0,
        want: PREFIX_LEN,
    })?;
    Ok(wire::decode::<T>(&payload)?)
}

type NextFrame<T> = std::pin::Pin<
    Box<dyn std::future::Future<Output = (RecvStream, Result<Option<T>, StreamError>)> + Send>,
>;

/// The framed archives of a receive stream, one at a time, with a
/// cancel-safe [`Frames::next`]: the read in progress lives in the value,
/// so dropping a `next()` future (in a `select!`) loses nothing.
pub struct Frames<T> {
    next: Option<NextFrame<T>>,
    max: u32,
}

impl<T: Decode + Send + 'static> Frames<T> {
    /// Frames of at most `max` bytes read from `recv`.
    pub fn new(recv: RecvStream, max: u32) -> Self {
        Self {
            next: Some(Self::read(recv, max)),
            max,
        }
    }

    fn read(mut recv: RecvStream, max: u32) -> NextFrame<T> {
        Box::pin(async move {
            let result = match recv_frame(&mut recv, max).await {
                Ok(Some(bytes)) => wire::decode::<T>(&bytes)
                    .map(Some)
                    .map_err(StreamError::from),
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            };
            (recv, result)
        })
    }

    /// The next archive; `None` once the stream ended cleanly or failed
    /// (the failure is returned once, first).
    ///
    /// Cancel safety: cancel-safe.
    pub async fn next(&mut self) -> Option<Result<T, StreamError>> {
        let pending = self.next.as_mut()?;
        let (recv, result) = pending.as_mut().await;
        match result {
            Ok(Some(msg)) => {
                self.next = Some(Self::read(recv, self.max));
                Some(Ok(msg))
            }
            Ok(None) => {
                self.next = None;
                None
            }
            Err(e) => {
                self.next = None;
                Some(Err(e))
            }
        }
    }
}

/// Dialer side: opens a stream on `connection`, sends `hello` and waits for
/// the acceptor's answer. Returns the stream and the acceptor's name and
/// incarnation.
pub async fn dial(
    connection: &quinn::Connection,
    hello: &Hello,
) -> Result<(SendStream, RecvStream, MemberName, Incarnation), StreamError> {
    let (mut send, mut recv) = connection.open_bi().await.map_err(io)?;
    send_msg(&mut send, hello, frame::DEFAULT_MAX_FRAME).await?;
    match recv_msg::<HelloReply>(&mut recv, frame::DEFAULT_MAX_FRAME).await? {
        HelloReply::Accepted { node, incarnation } => Ok((send, recv, node, incarnation)),
        HelloReply::Refused(r) => Err(StreamError::Refused(r)),
    }
}

/// How long a peer has, once it opened a stream, to send its hello.
pub const HELLO_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// What an acceptor checks each hello against.
pub struct Gate<'a> {
    /// The acceptor's node name, sent back in the reply.
    pub name: &'a str,
    /// The acceptor's incarnation, sent back in the reply.
    pub incarnation: Incarnation,
    /// The acceptor's cookie digest; the hello's must equal it.
    pub cookie: CookieDigest,
    /// The purposes this endpoint serves.
    pub serves: &'a [Purpose],
    /// What the acceptor's member table holds for a node name: its
    /// incarnation and whether it is up (see
    /// [`flotilla_proto::hello::check_incarnation`]).
    pub known: &'a (dyn Fn(&str) -> Option<(Incarnation, bool)> + Sync),
    /// Whether a certificate serial number is revoked.
    pub revoked: &'a (dyn Fn(&[u8]) -> bool + Sync),
    /// The member name an earlier stream of this connection proved: every
    /// stream of a connection speaks for one member.
    pub bound: Option<&'a str>,
}

impl Gate<'_> {
    /// The verdict on `hello` from the peer of `pc`: its certificate's name,
    /// role and serial, the cookie, the purposes served, the name the
    /// connection is bound to, and the incarnation fence. Whether the peer
    /// must be an up member is the caller's to check ([`needs_membership`]).
    pub fn check(&self, hello: &Hello, pc: &crate::PeerConnection) -> Result<(), Refusal> {
        check_hello(hello, &pc.peer, pc.role, &self.cookie)?;
        if (self.revoked)(&pc.serial) {
            return Err(Refusal::Revoked);
        }
        if self.bound.is_some_and(|b| b != hello.node) {
            return Err(Refusal::IdentityMismatch);
        }
        if !self.serves.contains(&hello.purpose) {
            return Err(Refusal::WrongEndpoint);
        }
        check_incarnation(hello.incarnation, (self.known)(&hello.node))
    }
}

/// Whether streams of `purpose` are for up members only: every one but
/// control streams, which tools and joining nodes open.
pub fn needs_membership(purpose: Purpose) -> bool {
    purpose != Purpose::Control
}

/// Acceptor side, first half: takes the next stream the peer opens and
/// reads its hello, which must come within [`HELLO_DEADLINE`].
pub async fn read_hello(
    connection: &quinn::Connection,
) -> Result<(SendStream, RecvStream, Hello), StreamError> {
    let (send, mut recv) = connection.accept_bi().await.map_err(io)?;
    match tokio::time::timeout(
        HELLO_DEADLINE,
        recv_msg::<Hello>(&mut recv, frame::DEFAULT_MAX_FRAME),
    )
    .await
    {
        Ok(hello) => Ok((send, recv, hello?)),
        Err(_) => Err(StreamError::HelloTimeout(HELLO_DEADLINE)),
    }
}

/// Acceptor side, second half: answers a hello read with [`read_hello`]
/// with the verdict. On refusal the reason is sent back before the error
/// is returned.
pub async fn answer(
    send: &mut SendStream,
    verdict: Result<(), Refusal>,
    name: &str,
    incarnation: Incarnation,
) -> Result<(), StreamError> {
    if let Err(refusal) = verdict {
        let _ = send_msg(
            send,
            &HelloReply::Refused(refusal),
            frame::DEFAULT_MAX_FRAME,
        )
        .await;
        let _ = send.finish();
        // The caller closes the connection with `close_after_accept`.
        return Err(StreamError::RefusedPeer(refusal));
    }
    let reply = HelloReply::Accepted {
        node: MemberName::from(name),
        incarnation,
    };
    send_msg(send, &reply, frame::DEFAULT_MAX_FRAME).await
}

/// Acceptor side: takes the next stream the peer opens, reads its hello and
/// checks it against the peer's certificate and the `gate`. On refusal the
/// reason is sent back before the error is returned.
pub async fn accept(
    pc: &crate::PeerConnection,
    gate: &Gate<'_>,
) -> Result<(SendStream, RecvStream, Hello), StreamError> {
    let (mut send, recv, hello) = read_hello(&pc.connection).await?;
    answer(
        &mut send,
        gate.check(&hello, pc),
        gate.name,
        gate.incarnation,
    )
    .await?;
    Ok((send, recv, hello))
}

/// Whether a peer's certificate carries `role`.
pub fn has_role(pc: &crate::PeerConnection, role: Role) -> bool {
    pc.role == Some(role)
}

/// How long a refused peer's connection stays open so the refusal reaches it.
const REFUSAL_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Logs why [`accept`] failed on `pc` and closes the connection: a refusal
/// is first given time to reach the peer (closing at once would discard
/// it on the peer's side); a bad hello closes at once.
pub async fn close_after_accept(pc: &crate::PeerConnection, error: &StreamError) {
    if let StreamError::RefusedPeer(_) = error {
        tracing::warn!(peer = %pc.peer, %error, "refused a peer");
        tokio::time::sleep(REFUSAL_GRACE).await;
    } else {
        tracing::warn!(peer = %pc.peer, %error, "NODE-WIRE-002: closing connection after a bad hello");
    }
    error.closing().close(&pc.connection);
}
