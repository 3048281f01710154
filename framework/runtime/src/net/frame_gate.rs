//! The async shell of [`flotilla_proto::cluster_frames::Book`]: each
//! cluster stream's read half hands ractor_cluster only the frames the
//! book admits for the peer's certificate (what it refuses is dropped,
//! counted, and the session goes on); its write half tells the book of
//! the calls this node answered.
//!
//! ```text
//! QUIC recv ─► Splitter ─► Book::inbound ─ admitted ─► ractor_cluster NodeSession
//!                              └ refused: dropped, flotilla_principal_capped_total{what}
//! ractor_cluster ─► ReplySkimmer ─► Book::answered ─► QUIC send
//! ```

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use flotilla_proto::cluster_frames::{Book, Counted, ReplySkimmer, SessionId, Splitter};
use flotilla_proto::ids::MemberName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::clock::now;

/// Bytes read from the stream at a time.
const READ_CHUNK: usize = 64 << 10;

/// The book of one node's cluster sessions. Cheap to clone; every clone
/// sees the same.
#[derive(Clone)]
pub(crate) struct FrameGate {
    book: Arc<Mutex<Book>>,
    next: Arc<AtomicU64>,
    max_frame: u64,
}

impl FrameGate {
    /// A gate for frames of at most `max_frame` payload bytes (the limit
    /// the node server is given).
    pub(crate) fn new(max_frame: u64) -> Self {
        Self {
            book: Arc::default(),
            next: Arc::new(AtomicU64::new(1)),
            max_frame,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a session with `member`, of certificate `principal`; it is
    /// closed in the book when both halves are dropped.
    pub(crate) fn open(&self, principal: &str, member: &str) -> Ticket {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().open(id, principal);
        Ticket(Arc::new(Open {
            gate: self.clone(),
            id,
            member: MemberName::from(member),
        }))
    }

    /// What the sessions of `principal` hold now.
    #[cfg(test)]
    fn totals(&self, principal: &str) -> flotilla_proto::cluster_frames::Totals {
        self.lock().totals(principal)
    }
}

struct Open {
    gate: FrameGate,
    id: SessionId,
    member: MemberName,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.gate.lock().close(self.id);
    }
}

/// One session's place in the book, shared by its two halves.
#[derive(Clone)]
pub(crate) struct Ticket(Arc<Open>);

impl Ticket {
    /// `read`, passing only the frames the book admits.
    pub(crate) fn reader<R>(&self, read: R) -> GatedRead<R> {
        GatedRead {
            inner: read,
            splitter: Splitter::new(self.0.gate.max_frame),
            admitted: Vec::new(),
            pos: 0,
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
            ticket: self.clone(),
        }
    }

    /// `write`, telling the book of each answer written.
    pub(crate) fn writer<W>(&self, write: W) -> WatchedWrite<W> {
        WatchedWrite {
            inner: write,
            skimmer: ReplySkimmer::new(),
            ticket: self.clone(),
        }
    }

    fn admit(&self, frame: &[u8]) -> bool {
        let open = &self.0;
        let verdict = open.gate.lock().inbound(now(), open.id, frame);
        match verdict {
            Ok(()) => true,
            Err(why) => {
                match why.counted() {
                    Counted::Cap(what) => crate::counters::principal_capped(what),
                    Counted::Rule(reason) => crate::counters::cluster_frame_refused(reason),
                }
                tracing::warn!(peer = %open.member, error = %why, "dropped a cluster frame");
                false
            }
        }
    }
}

/// A cluster stream's read half that drops the frames its book refuses.
pub(crate) struct GatedRead<R> {
    inner: R,
    splitter: Splitter,
    /// The admitted frame being handed over, from `pos`.
    admitted: Vec<u8>,
    pos: usize,
    chunk: Box<[u8]>,
    ticket: Ticket,
}

impl<R: AsyncRead + Unpin> AsyncRead for GatedRead<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.pos < this.admitted.len() {
                let n = buf.remaining().min(this.admitted.len() - this.pos);
                buf.put_slice(&this.admitted[this.pos..this.pos + n]);
                this.pos += n;
                if this.pos == this.admitted.len() {
                    this.admitted.clear();
                    this.pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            match this.splitter.next_frame() {
                Err(e) => return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e))),
                Ok(Some(frame)) => {
                    if this.ticket.admit(&frame) {
                        this.admitted = frame;
                    }
                    continue;
                }
                Ok(None) => {}
            }
            let mut chunk = ReadBuf::new(&mut this.chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk))?;
            if chunk.filled().is_empty() {
                // The stream ended: so does ractor's, without the part
                // of a frame left over.
                return Poll::Ready(Ok(()));
            }
            this.splitter.push(chunk.filled());
        }
    }
}

/// A cluster stream's write half that finds the answers written.
pub(crate) struct WatchedWrite<W> {
    inner: W,
    skimmer: ReplySkimmer,
    ticket: Ticket,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for WatchedWrite<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.inner).poll_write(cx, buf))?;
        let answered = self.skimmer.push(&buf[..n]);
        if !answered.is_empty() {
            let open = &self.ticket.0;
            let mut book = open.gate.lock();
            for (to, tag) in answered {
                book.answered(open.id, to, tag);
            }
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::cluster_frames::MAX_PENDING_CALLS_PER_PRINCIPAL;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn varint(mut v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        while v >= 0x80 {
            out.push(0x80 | (v & 0x7f) as u8);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    /// A call frame as ractor_cluster writes it: node (2) › call (2) ›
    /// to (1), tag (3), timeout_ms (4).
    fn call(to: u8, tag: u16, timeout_ms: u64) -> Vec<u8> {
        let tag = [0x80 | (tag & 0x7f) as u8, (tag >> 7) as u8];
        let call = [&[0x08, to, 0x18][..], &tag, &[0x20], &varint(timeout_ms)].concat();
        let node = [vec![0x12, call.len() as u8], call].concat();
        let msg = [vec![0x12, node.len() as u8], node].concat();
        [(msg.len() as u64).to_be_bytes().to_vec(), msg].concat()
    }

    /// The answer to it: node (2) › reply (3) › to (1), tag (2), what (3).
    fn reply(to: u8, tag: u16) -> Vec<u8> {
        let tag = [0x80 | (tag & 0x7f) as u8, (tag >> 7) as u8];
        let reply = [&[0x08, to, 0x10][..], &tag, &[0x1a, 1, 0xaa]].concat();
        let node = [vec![0x1a, reply.len() as u8], reply].concat();
        let msg = [vec![0x12, node.len() as u8], node].concat();
        [(msg.len() as u64).to_be_bytes().to_vec(), msg].concat()
    }

    #[tokio::test]
    async fn a_peer_past_its_open_calls_cap_has_its_calls_dropped_not_its_session() {
        let gate = FrameGate::new(1 << 20);
        let ticket = gate.open("mallory", "m1");
        let cap = MAX_PENDING_CALLS_PER_PRINCIPAL as u16;
        let calls: Vec<u8> = (0..=cap).flat_map(|tag| call(5, tag, 60_000)).collect();
        let (mut peer, ours) = tokio::io::duplex(1 << 16);
        let mut reader = ticket.reader(ours);
        let feed = tokio::spawn(async move {
            peer.write_all(&calls).await.unwrap();
            peer
        });
        let one = call(5, 0, 60_000).len();
        let mut got = vec![0; one * usize::from(cap)];
        reader.read_exact(&mut got).await.unwrap();
        let peer = feed.await.unwrap();
        assert_eq!(
            got[..one],
            call(5, 0, 60_000)[..],
            "admitted frames pass whole"
        );
        assert_eq!(gate.totals("mallory").calls, usize::from(cap));
        drop(peer);
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "the call past the cap is dropped");

        // Answering frees places; closing the session frees the rest.
        let mut writer = ticket.writer(Vec::new());
        let answers: Vec<u8> = (0..10).flat_map(|tag| reply(5, tag)).collect();
        for piece in answers.chunks(5) {
            writer.write_all(piece).await.unwrap();
        }
        assert_eq!(gate.totals("mallory").calls, usize::from(cap) - 10);
        drop((reader, writer, ticket));
        assert_eq!(gate.totals("mallory").calls, 0);
    }
}
