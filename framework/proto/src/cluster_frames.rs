//! ractor_cluster's frames as they cross a node's cluster streams: cut
//! from the byte stream, read just far enough to see what each one makes
//! the node hold (a reference to a peer's actor, a membership of a process
//! group, a call kept open until it is answered), and admitted under caps
//! per certificate.
//!
//! ractor_cluster (0.16) writes each message as an 8-byte big-endian
//! length and a protobuf `NetworkMessage`; this module reads the fields
//! that matter and skips the rest:
//!
//! ```text
//! NetworkMessage ─ auth (1)
//!                ├ node (2) ──── cast (1) · call (2): to 1, tag 3, timeout_ms 4 · reply (3): to 1, tag 2
//!                └ control (3) ─ spawn (1): actors 1 · terminate (2): ids 1
//!                                pg_join (5) / pg_leave (6): group 1, actors 2, scope 3
//!                                (actor: pid 1, name 2)
//! ```
//!
//! A frame is read as protobuf reads it or refused: a message with two of
//! a `oneof`'s fields (protobuf would keep the last, merging), a wire type
//! a field cannot have, or a truncated field is [`Malformed`], so nothing
//! this module passes means one thing here and another to ractor_cluster.
//!
//! [`Book`] is the policy, a plain state machine (time passed in): what
//! each session's peer made this node hold, summed per certificate, and
//! what it may not add.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Size of ractor_cluster's length prefix in bytes.
pub const PREFIX_LEN: usize = 8;

/// Most references to peers' actors the sessions of one certificate may
/// make a node hold (each actor a peer announces becomes one).
pub const MAX_PROXIES_PER_PRINCIPAL: usize = 16_384;

/// Most process-group memberships the sessions of one certificate may
/// make a node hold.
pub const MAX_MEMBERSHIPS_PER_PRINCIPAL: usize = 16_384;

/// Most calls from the sessions of one certificate a node holds open at
/// once (asked, neither answered nor past their timeout).
pub const MAX_PENDING_CALLS_PER_PRINCIPAL: usize = 4_096;

/// Longest timeout a call from a peer may carry; a call without one, or
/// with a longer one, is refused.
pub const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// Longest process-group or scope name a peer may join, in bytes.
pub const MAX_GROUP_NAME: usize = 256;

/// A stream that cannot go on: the peer sent more than the limit in one
/// frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cluster frame of {len} bytes exceeds the limit of {max} bytes")]
pub struct TooLarge {
    /// The announced length.
    pub len: u64,
    /// The limit in force.
    pub max: u64,
}

/// Cuts whole frames (prefix and payload) from a byte stream that arrives
/// in pieces. It buffers at most one frame and what has arrived after it.
#[derive(Debug)]
pub struct Splitter {
    buf: Vec<u8>,
    start: usize,
    max: u64,
}

impl Splitter {
    /// A splitter refusing payloads over `max` bytes.
    pub fn new(max: u64) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            max,
        }
    }

    /// Appends bytes received.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, prefix included; `None` until one is whole.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, TooLarge> {
        let rest = &self.buf[self.start..];
        let Some(prefix) = rest.first_chunk::<PREFIX_LEN>() else {
            return Ok(None);
        };
        let len = u64::from_be_bytes(*prefix);
        if len > self.max {
            return Err(TooLarge { len, max: self.max });
        }
        // Fits: `len <= max`, and `max` bytes are allocatable by the caller.
        let whole = PREFIX_LEN + len as usize;
        if rest.len() < whole {
            return Ok(None);
        }
        let frame = rest[..whole].to_vec();
        self.start += whole;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        Ok(Some(frame))
    }

    /// Bytes received and not yet cut into a frame.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// Finds the answers to calls among the frames a node writes, keeping
/// only the first bytes of each frame (an answer's actor and tag come
/// before its payload, as protobuf writes fields in order), so watching a
/// stream costs no copy of what it carries.
#[derive(Debug, Default)]
pub struct ReplySkimmer {
    head: Vec<u8>,
    /// Payload bytes of the current frame still to pass, once its prefix
    /// is whole.
    left: Option<u64>,
}

/// Bytes of a frame kept to find an answer's actor and tag: the prefix
/// and five keys with their varints at most.
const HEAD: usize = PREFIX_LEN + 5 * 11;

impl ReplySkimmer {
    /// A skimmer at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Looks at bytes written; returns the `(to, tag)` of each answer to
    /// a call that ended in them.
    pub fn push(&mut self, mut bytes: &[u8]) -> Vec<(Pid, u64)> {
        let mut replies = Vec::new();
        while !bytes.is_empty() {
            let left = match self.left {
                Some(left) => left,
                None => {
                    let want = PREFIX_LEN - self.head.len();
                    let (take, rest) = bytes.split_at(want.min(bytes.len()));
                    self.head.extend_from_slice(take);
                    bytes = rest;
                    let Some(prefix) = self.head.first_chunk::<PREFIX_LEN>() else {
                        continue;
                    };
                    let len = u64::from_be_bytes(*prefix);
                    self.left = Some(len);
                    len
                }
            };
            let n = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
            let keep = (HEAD - self.head.len().min(HEAD)).min(n);
            self.head.extend_from_slice(&bytes[..keep]);
            bytes = &bytes[n..];
            let left = left - n as u64;
            self.left = Some(left);
            if left == 0 {
                replies.extend(reply_head(&self.head[PREFIX_LEN..]));
                self.head.clear();
                self.left = None;
            }
        }
        replies
    }
}

/// The actor and tag of an answer from the first bytes of its payload.
fn reply_head(head: &[u8]) -> Option<(Pid, u64)> {
    let mut f = Fields(head);
    // NetworkMessage.node (2), then NodeMessage.reply (3), each a message.
    for key in [0x12, 0x1a] {
        if f.varint().ok()? != key {
            return None;
        }
        f.varint().ok()?;
    }
    let (mut to, mut tag) = (0, 0);
    loop {
        if f.0.is_empty() {
            return Some((to, tag));
        }
        match f.varint().ok()? {
            0x08 => to = f.varint().ok()?,
            0x10 => tag = f.varint().ok()?,
            // The payload (3): both fields before it are read.
            0x1a => return Some((to, tag)),
            _ => return None,
        }
    }
}

/// An actor a peer names: its id on the peer.
pub type Pid = u64;

/// A process-group membership: an actor in a group of a scope.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Membership {
    /// The group's scope.
    pub scope: String,
    /// The group.
    pub group: String,
    /// The actor.
    pub pid: Pid,
}

/// What a frame asks of the node that receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A call to a local actor, answered with a reply carrying the same
    /// `to` and `tag`.
    Call {
        /// The local actor.
        to: Pid,
        /// The caller's tag.
        tag: u64,
        /// The timeout it carries, if any.
        timeout_ms: Option<u64>,
    },
    /// The answer to a call.
    Reply {
        /// The actor called.
        to: Pid,
        /// The caller's tag.
        tag: u64,
    },
    /// Actors the peer announces: each becomes a reference here.
    Spawn(Vec<Pid>),
    /// Actors the peer says have stopped.
    Terminate(Vec<Pid>),
    /// Actors joining process groups (each a reference too).
    Join(Vec<Membership>),
    /// Actors leaving process groups.
    Leave(Vec<Membership>),
    /// Anything else (casts, authentication, pings, readiness).
    Other,
}

/// A frame protobuf might read otherwise than this module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed cluster frame: {0}")]
pub struct Malformed(&'static str);

/// A protobuf field: its number and value.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// Reads protobuf fields one by one.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.0.split_first().ok_or(Malformed("truncated varint"))?;
            self.0 = rest;
            if i == 9 && b > 1 {
                return Err(Malformed("varint past 64 bits"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Malformed("varint past 64 bits"))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], Malformed> {
        let n = usize::try_from(n).map_err(|_| Malformed("length past memory"))?;
        if n > self.0.len() {
            return Err(Malformed("truncated field"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn next(&mut self) -> Result<Option<(u64, Value<'a>)>, Malformed> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 {
            return Err(Malformed("field number 0"));
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed
            }
            2 => {
                let n = self.varint()?;
                Value::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Value::Fixed
            }
            _ => return Err(Malformed("group or unknown wire type")),
        };
        Ok(Some((number, value)))
    }
}

/// The one field of a `oneof` set among `numbers`, as bytes; two set, or
/// one that is not a message, is malformed.
fn one_of<'a>(bytes: &'a [u8], numbers: &[u64]) -> Result<Option<(u64, &'a [u8])>, Malformed> {
    let mut fields = Fields(bytes);
    let mut found = None;
    while let Some((n, v)) = fields.next()? {
        if !numbers.contains(&n) {
            continue;
        }
        let Value::Bytes(b) = v else {
            return Err(Malformed("oneof field is not a message"));
        };
        if found.replace((n, b)).is_some() {
            return Err(Malformed("two fields of one oneof"));
        }
    }
    Ok(found)
}

/// A varint field's value (the last one, as protobuf reads it).
fn varint_field(v: &Value<'_>) -> Result<u64, Malformed> {
    match v {
        Value::Varint(x) => Ok(*x),
        _ => Err(Malformed("varint field with another wire type")),
    }
}

/// A bytes field's value.
fn bytes_field<'a>(v: &Value<'a>) -> Result<&'a [u8], Malformed> {
    match v {
        Value::Bytes(b) => Ok(b),
        _ => Err(Malformed("bytes field with another wire type")),
    }
}

/// A `control.Actor`'s pid.
fn actor_pid(bytes: &[u8]) -> Result<Pid, Malformed> {
    let mut fields = Fields(bytes);
    let mut pid = 0;
    while let Some((n, v)) = fields.next()? {
        match n {
            1 => pid = varint_field(&v)?,
            2 => {
                bytes_field(&v)?;
            }
            _ => {}
        }
    }
    Ok(pid)
}

/// The pids of the `control.Actor`s in field `number` of `bytes`.
fn actor_pids(bytes: &[u8], number: u64) -> Result<Vec<Pid>, Malformed> {
    let mut fields = Fields(bytes);
    let mut pids = Vec::new();
    while let Some((n, v)) = fields.next()? {
        if n == number {
            pids.push(actor_pid(bytes_field(&v)?)?);
        }
    }
    Ok(pids)
}

/// The memberships of a `PgJoin` or `PgLeave`.
fn memberships(bytes: &[u8]) -> Result<Vec<Membership>, Malformed> {
    let mut fields = Fields(bytes);
    let (mut group, mut scope) = (Vec::new(), Vec::new());
    while let Some((n, v)) = fields.next()? {
        match n {
            1 => group = bytes_field(&v)?.to_vec(),
            3 => scope = bytes_field(&v)?.to_vec(),
            _ => {}
        }
    }
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(|_| Malformed("group name not UTF-8"));
    let (group, scope) = (text(group)?, text(scope)?);
    Ok(actor_pids(bytes, 2)?
        .into_iter()
        .map(|pid| Membership {
            scope: scope.clone(),
            group: group.clone(),
            pid,
        })
        .collect())
}

/// The ids of a `Terminate`, packed or not.
fn terminated(bytes: &[u8]) -> Result<Vec<Pid>, Malformed> {
    let mut fields = Fields(bytes);
    let mut ids = Vec::new();
    while let Some((n, v)) = fields.next()? {
        if n != 1 {
            continue;
        }
        match v {
            Value::Varint(id) => ids.push(id),
            Value::Bytes(mut packed) => {
                while !packed.is_empty() {
                    let mut f = Fields(packed);
                    ids.push(f.varint()?);
                    packed = f.0;
                }
            }
            Value::Fixed => return Err(Malformed("fixed-width terminate id")),
        }
    }
    Ok(ids)
}

/// What the frame `frame` (prefix included) asks of the node receiving
/// it.
pub fn read(frame: &[u8]) -> Result<Seen, Malformed> {
    let payload = frame.get(PREFIX_LEN..).ok_or(Malformed("no prefix"))?;
    match one_of(payload, &[1, 2, 3])? {
        Some((2, node)) => read_node(node),
        Some((3, control)) => read_control(control),
        _ => Ok(Seen::Other),
    }
}

fn read_node(node: &[u8]) -> Result<Seen, Malformed> {
    let Some((n, msg)) = one_of(node, &[1, 2, 3])? else {
        return Ok(Seen::Other);
    };
    let mut fields = Fields(msg);
    let (mut to, mut tag, mut timeout_ms) = (0, 0, None);
    while let Some((f, v)) = fields.next()? {
        match (n, f) {
            (2, 1) | (3, 1) => to = varint_field(&v)?,
            (2, 3) | (3, 2) => tag = varint_field(&v)?,
            (2, 4) => timeout_ms = Some(varint_field(&v)?),
            _ => {}
        }
    }
    Ok(match n {
        2 => Seen::Call {
            to,
            tag,
            timeout_ms,
        },
        3 => Seen::Reply { to, tag },
        _ => Seen::Other,
    })
}

fn read_control(control: &[u8]) -> Result<Seen, Malformed> {
    let Some((n, msg)) = one_of(control, &[1, 2, 3, 4, 5, 6, 7, 8, 9])? else {
        return Ok(Seen::Other);
    };
    Ok(match n {
        1 => Seen::Spawn(actor_pids(msg, 1)?),
        2 => Seen::Terminate(terminated(msg)?),
        5 => Seen::Join(memberships(msg)?),
        6 => Seen::Leave(memberships(msg)?),
        _ => Seen::Other,
    })
}

/// Why a frame was not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The frame does not read as one meaning.
    #[error("NODE-AUTH-030: {0}")]
    Malformed(Malformed),
    /// The certificate's sessions hold the most references allowed.
    #[error(
        "NODE-AUTH-030: this certificate's sessions hold {MAX_PROXIES_PER_PRINCIPAL} references to their actors here"
    )]
    Proxies,
    /// The certificate's sessions hold the most group memberships allowed.
    #[error(
        "NODE-AUTH-030: this certificate's sessions hold {MAX_MEMBERSHIPS_PER_PRINCIPAL} group memberships here"
    )]
    Memberships,
    /// A group or scope name past [`MAX_GROUP_NAME`].
    #[error("NODE-AUTH-030: a group name over {MAX_GROUP_NAME} bytes")]
    GroupName,
    /// The certificate's sessions hold the most open calls allowed.
    #[error(
        "NODE-AUTH-030: this certificate's sessions hold {MAX_PENDING_CALLS_PER_PRINCIPAL} calls open here"
    )]
    Calls,
    /// A call whose tag is open already on the same session.
    #[error("NODE-AUTH-030: a call whose tag is open already")]
    DuplicateCall,
    /// A call with no timeout, or one past [`MAX_CALL_TIMEOUT`].
    #[error("NODE-AUTH-030: a call without a timeout of at most {MAX_CALL_TIMEOUT:?}")]
    CallTimeout,
}

/// Which counter a refused frame adds to, and its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// A per-certificate cap was reached: `flotilla_principal_capped_total{what}`.
    Cap(&'static str),
    /// The frame breaks a rule whatever the certificate holds:
    /// `flotilla_cluster_frames_refused_total{reason}`.
    Rule(&'static str),
}

impl Refused {
    /// The counter a refusal adds to.
    pub fn counted(self) -> Counted {
        match self {
            Self::Proxies => Counted::Cap("proxies"),
            Self::Memberships => Counted::Cap("group_memberships"),
            Self::Calls => Counted::Cap("pending_calls"),
            Self::Malformed(_) => Counted::Rule("malformed"),
            Self::GroupName => Counted::Rule("group_name"),
            Self::DuplicateCall => Counted::Rule("duplicate_call"),
            Self::CallTimeout => Counted::Rule("call_timeout"),
        }
    }
}

/// What one session's peer made this node hold.
#[derive(Debug, Default)]
struct Held {
    principal: String,
    proxies: BTreeSet<Pid>,
    memberships: BTreeSet<Membership>,
    calls: HashMap<(Pid, u64), Instant>,
}

/// What one certificate's sessions hold together.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// References to its actors.
    pub proxies: usize,
    /// Process-group memberships.
    pub memberships: usize,
    /// Calls held open.
    pub calls: usize,
}

/// Sessions by an id of the caller's choosing.
pub type SessionId = u64;

/// The per-certificate policy over every cluster session of a node.
#[derive(Debug, Default)]
pub struct Book {
    sessions: HashMap<SessionId, Held>,
    totals: HashMap<String, Totals>,
}

impl Book {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens session `id` with a peer of certificate `principal`.
    pub fn open(&mut self, id: SessionId, principal: &str) {
        self.close(id);
        self.sessions.insert(
            id,
            Held {
                principal: principal.to_owned(),
                ..Held::default()
            },
        );
        self.totals.entry(principal.to_owned()).or_default();
    }

    /// Closes session `id`: what it held goes with it (ractor_cluster
    /// stops a session's references and its calls' answers with it).
    pub fn close(&mut self, id: SessionId) {
        let Some(held) = self.sessions.remove(&id) else {
            return;
        };
        if let Some(t) = self.totals.get_mut(&held.principal) {
            t.proxies -= held.proxies.len();
            t.memberships -= held.memberships.len();
            t.calls -= held.calls.len();
            if *t == Totals::default()
                && !self
                    .sessions
                    .values()
                    .any(|h| h.principal == held.principal)
            {
                self.totals.remove(&held.principal);
            }
        }
    }

    /// What `principal`'s sessions hold.
    pub fn totals(&self, principal: &str) -> Totals {
        self.totals.get(principal).copied().unwrap_or_default()
    }

    /// Forgets the calls of `principal`'s sessions past their timeout
    /// (`this` is one of them, out of the map while it is being served).
    fn expire(&mut self, now: Instant, this: &mut Held) {
        let mut gone = 0;
        let principal = this.principal.clone();
        let others = self
            .sessions
            .values_mut()
            .filter(|h| h.principal == principal);
        for held in others.chain(std::iter::once(this)) {
            let before = held.calls.len();
            held.calls.retain(|_, until| *until > now);
            gone += before - held.calls.len();
        }
        self.total(&principal).calls -= gone;
    }

    /// A frame the peer of session `id` sent: let through (what it makes
    /// the node hold is recorded), or refused (nothing recorded; the frame
    /// is to be dropped, and the session goes on).
    pub fn inbound(&mut self, now: Instant, id: SessionId, frame: &[u8]) -> Result<(), Refused> {
        let seen = read(frame).map_err(Refused::Malformed)?;
        let Some(mut held) = self.sessions.remove(&id) else {
            return Ok(());
        };
        let admitted = self.admit(now, &mut held, seen);
        self.sessions.insert(id, held);
        admitted
    }

    fn admit(&mut self, now: Instant, held: &mut Held, seen: Seen) -> Result<(), Refused> {
        match seen {
            Seen::Call {
                to,
                tag,
                timeout_ms,
            } => {
                let timeout = timeout_ms
                    .map(Duration::from_millis)
                    .filter(|t| *t <= MAX_CALL_TIMEOUT)
                    .ok_or(Refused::CallTimeout)?;
                // ractor_cluster serves every call it reads, so one tag
                // asked twice would hold two places.
                if held.calls.get(&(to, tag)).is_some_and(|until| *until > now) {
                    return Err(Refused::DuplicateCall);
                }
                if self.totals(&held.principal).calls >= MAX_PENDING_CALLS_PER_PRINCIPAL {
                    self.expire(now, held);
                }
                if self.totals(&held.principal).calls >= MAX_PENDING_CALLS_PER_PRINCIPAL {
                    return Err(Refused::Calls);
                }
                if held.calls.insert((to, tag), now + timeout).is_none() {
                    self.total(&held.principal).calls += 1;
                }
            }
            Seen::Spawn(pids) => self.add_proxies(held, pids)?,
            Seen::Join(members) => {
                if members
                    .iter()
                    .any(|m| m.scope.len() > MAX_GROUP_NAME || m.group.len() > MAX_GROUP_NAME)
                {
                    return Err(Refused::GroupName);
                }
                let new: BTreeSet<Membership> = members
                    .into_iter()
                    .filter(|m| !held.memberships.contains(m))
                    .collect();
                if self.totals(&held.principal).memberships + new.len()
                    > MAX_MEMBERSHIPS_PER_PRINCIPAL
                {
                    return Err(Refused::Memberships);
                }
                self.add_proxies(held, new.iter().map(|m| m.pid).collect())?;
                self.total(&held.principal).memberships += new.len();
                held.memberships.extend(new);
            }
            Seen::Leave(members) => {
                let before = held.memberships.len();
                for m in &members {
                    held.memberships.remove(m);
                }
                self.total(&held.principal).memberships -= before - held.memberships.len();
            }
            Seen::Terminate(pids) => {
                let (p, m) = (held.proxies.len(), held.memberships.len());
                for pid in &pids {
                    held.proxies.remove(pid);
                }
                held.memberships.retain(|m| !pids.contains(&m.pid));
                let t = self.total(&held.principal);
                t.proxies -= p - held.proxies.len();
                t.memberships -= m - held.memberships.len();
            }
            Seen::Reply { .. } | Seen::Other => {}
        }
        Ok(())
    }

    /// This node answered call `tag` to actor `to` on session `id` (a
    /// [`ReplySkimmer`] finds the answers among the frames written): its
    /// place is free.
    pub fn answered(&mut self, id: SessionId, to: Pid, tag: u64) {
        let Some(held) = self.sessions.get_mut(&id) else {
            return;
        };
        if held.calls.remove(&(to, tag)).is_some() {
            let principal = held.principal.clone();
            self.total(&principal).calls -= 1;
        }
    }

    fn add_proxies(&mut self, held: &mut Held, pids: Vec<Pid>) -> Result<(), Refused> {
        let new: BTreeSet<Pid> = pids
            .into_iter()
            .filter(|p| !held.proxies.contains(p))
            .collect();
        if self.totals(&held.principal).proxies + new.len() > MAX_PROXIES_PER_PRINCIPAL {
            return Err(Refused::Proxies);
        }
        self.total(&held.principal).proxies += new.len();
        held.proxies.extend(new);
        Ok(())
    }

    fn total(&mut self, principal: &str) -> &mut Totals {
        self.totals.entry(principal.to_owned()).or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a certificate may hold only so much of is a cap; what no frame
    /// may do is a broken rule: they are counted in different series.
    #[test]
    fn caps_and_broken_rules_are_counted_apart() {
        for cap in [Refused::Proxies, Refused::Memberships, Refused::Calls] {
            assert!(matches!(cap.counted(), Counted::Cap(_)), "{cap:?}");
        }
        for rule in [
            Refused::Malformed(Malformed("truncated varint")),
            Refused::GroupName,
            Refused::DuplicateCall,
            Refused::CallTimeout,
        ] {
            assert!(matches!(rule.counted(), Counted::Rule(_)), "{rule:?}");
        }
    }
    use proptest::prelude::*;
    use prost::Message;

    // ractor_cluster's messages, mirrored field for field from its .proto
    // files, so each test frame is what protobuf writes and reads.
    #[derive(Clone, PartialEq, prost::Message)]
    struct NetworkMessage {
        #[prost(oneof = "Net", tags = "1, 2, 3")]
        message: Option<Net>,
    }
    #[derive(Clone, PartialEq, prost::Oneof)]
    enum Net {
        #[prost(bytes, tag = "1")]
        Auth(Vec<u8>),
        #[prost(message, tag = "2")]
        Node(NodeMessage),
        #[prost(message, tag = "3")]
        Control(ControlMessage),
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct NodeMessage {
        #[prost(oneof = "NodeMsg", tags = "1, 2, 3")]
        msg: Option<NodeMsg>,
    }
    #[derive(Clone, PartialEq, prost::Oneof)]
    enum NodeMsg {
        #[prost(message, tag = "1")]
        Cast(Cast),
        #[prost(message, tag = "2")]
        Call(Call),
        #[prost(message, tag = "3")]
        Reply(CallReply),
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Cast {
        #[prost(uint64, tag = "1")]
        to: u64,
        #[prost(bytes = "vec", tag = "2")]
        what: Vec<u8>,
        #[prost(string, tag = "3")]
        variant: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Call {
        #[prost(uint64, tag = "1")]
        to: u64,
        #[prost(bytes = "vec", tag = "2")]
        what: Vec<u8>,
        #[prost(uint64, tag = "3")]
        tag: u64,
        #[prost(uint64, optional, tag = "4")]
        timeout_ms: Option<u64>,
        #[prost(string, tag = "5")]
        variant: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct CallReply {
        #[prost(uint64, tag = "1")]
        to: u64,
        #[prost(uint64, tag = "2")]
        tag: u64,
        #[prost(bytes = "vec", tag = "3")]
        what: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct ControlMessage {
        #[prost(oneof = "ControlMsg", tags = "1, 2, 3, 5, 6, 9")]
        msg: Option<ControlMsg>,
    }
    #[derive(Clone, PartialEq, prost::Oneof)]
    enum ControlMsg {
        #[prost(message, tag = "1")]
        Spawn(Spawn),
        #[prost(message, tag = "2")]
        Terminate(Terminate),
        #[prost(bytes, tag = "3")]
        Ping(Vec<u8>),
        #[prost(message, tag = "5")]
        PgJoin(Pg),
        #[prost(message, tag = "6")]
        PgLeave(Pg),
        #[prost(bytes, tag = "9")]
        Ready(Vec<u8>),
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Actor {
        #[prost(uint64, tag = "1")]
        pid: u64,
        #[prost(string, optional, tag = "2")]
        name: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Spawn {
        #[prost(message, repeated, tag = "1")]
        actors: Vec<Actor>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Terminate {
        #[prost(uint64, repeated, tag = "1")]
        ids: Vec<u64>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Pg {
        #[prost(string, tag = "1")]
        group: String,
        #[prost(message, repeated, tag = "2")]
        actors: Vec<Actor>,
        #[prost(string, tag = "3")]
        scope: String,
    }

    fn frame(m: &NetworkMessage) -> Vec<u8> {
        let body = m.encode_to_vec();
        let mut f = (body.len() as u64).to_be_bytes().to_vec();
        f.extend(body);
        f
    }
    fn node(msg: NodeMsg) -> Vec<u8> {
        frame(&NetworkMessage {
            message: Some(Net::Node(NodeMessage { msg: Some(msg) })),
        })
    }
    fn control(msg: ControlMsg) -> Vec<u8> {
        frame(&NetworkMessage {
            message: Some(Net::Control(ControlMessage { msg: Some(msg) })),
        })
    }
    fn call(to: u64, tag: u64, timeout_ms: Option<u64>) -> Vec<u8> {
        node(NodeMsg::Call(Call {
            to,
            tag,
            timeout_ms,
            what: vec![1; 40],
            variant: "Ask".into(),
        }))
    }
    fn answer(book: &mut Book, id: SessionId, to: u64, tag: u64) {
        for (to, tag) in ReplySkimmer::new().push(&reply(to, tag)) {
            book.answered(id, to, tag);
        }
    }
    fn reply(to: u64, tag: u64) -> Vec<u8> {
        node(NodeMsg::Reply(CallReply {
            to,
            tag,
            what: vec![2; 8],
        }))
    }
    fn actors(pids: impl IntoIterator<Item = u64>) -> Vec<Actor> {
        pids.into_iter()
            .map(|pid| Actor {
                pid,
                name: Some(format!("a{pid}")),
            })
            .collect()
    }
    fn spawn(pids: impl IntoIterator<Item = u64>) -> Vec<u8> {
        control(ControlMsg::Spawn(Spawn {
            actors: actors(pids),
        }))
    }
    fn join(group: &str, pids: impl IntoIterator<Item = u64>) -> Vec<u8> {
        control(ControlMsg::PgJoin(Pg {
            group: group.into(),
            actors: actors(pids),
            scope: "default".into(),
        }))
    }

    #[test]
    fn frames_read_as_protobuf_writes_them() {
        assert_eq!(
            read(&call(7, 3, Some(500))),
            Ok(Seen::Call {
                to: 7,
                tag: 3,
                timeout_ms: Some(500)
            })
        );
        assert_eq!(read(&reply(7, 3)), Ok(Seen::Reply { to: 7, tag: 3 }));
        assert_eq!(read(&spawn([1, 2])), Ok(Seen::Spawn(vec![1, 2])));
        assert_eq!(
            read(&join("g", [4])),
            Ok(Seen::Join(vec![Membership {
                scope: "default".into(),
                group: "g".into(),
                pid: 4
            }]))
        );
        assert_eq!(
            read(&control(ControlMsg::Terminate(Terminate {
                ids: vec![1, 300]
            }))),
            Ok(Seen::Terminate(vec![1, 300])),
            "packed"
        );
        // Unpacked ids (protobuf reads both forms).
        let mut unpacked = vec![0x08, 0x01, 0x08, 0x02];
        unpacked = [vec![0x12, unpacked.len() as u8], unpacked].concat();
        unpacked = [vec![0x1a, unpacked.len() as u8], unpacked].concat();
        let f = [(unpacked.len() as u64).to_be_bytes().to_vec(), unpacked].concat();
        assert_eq!(read(&f), Ok(Seen::Terminate(vec![1, 2])));
        for other in [
            node(NodeMsg::Cast(Cast {
                to: 1,
                what: vec![0; 3],
                variant: "V".into(),
            })),
            control(ControlMsg::Ready(vec![])),
            frame(&NetworkMessage {
                message: Some(Net::Auth(vec![1, 2, 3])),
            }),
            frame(&NetworkMessage { message: None }),
        ] {
            assert_eq!(read(&other), Ok(Seen::Other));
        }
    }

    #[test]
    fn a_frame_protobuf_would_read_otherwise_is_malformed() {
        // A control message followed by a call: protobuf keeps the last
        // field of the oneof (a call), so the pair may not pass as a ping.
        let ping = control(ControlMsg::Ping(vec![]));
        let call = call(1, 1, None);
        let two = [&ping[PREFIX_LEN..], &call[PREFIX_LEN..]].concat();
        let f = [(two.len() as u64).to_be_bytes().to_vec(), two].concat();
        assert!(read(&f).is_err());
        assert!(
            NetworkMessage::decode(&f[PREFIX_LEN..])
                .is_ok_and(|m| matches!(m.message, Some(Net::Node(_)))),
            "protobuf reads the call"
        );
        // Truncated, a group wire type, a varint past 64 bits.
        assert!(read(&call[..call.len() - 1]).is_err());
        assert!(read(&[0, 0, 0, 0, 0, 0, 0, 1, 0x13]).is_err());
        assert!(read(&[[0u8; 8].as_slice(), &[0x08], &[0xff; 10], &[0x01]].concat()).is_err());
    }

    fn session(book: &mut Book, id: SessionId, principal: &str) {
        book.open(id, principal);
    }

    #[test]
    fn a_peer_cannot_make_a_node_hold_open_calls_past_its_certificates_cap() {
        let t0 = Instant::now();
        let mut book = Book::new();
        session(&mut book, 1, "mallory");
        session(&mut book, 2, "mallory");
        session(&mut book, 3, "ops");
        for tag in 0..MAX_PENDING_CALLS_PER_PRINCIPAL as u64 {
            let id = 1 + tag % 2;
            assert_eq!(book.inbound(t0, id, &call(9, tag, Some(60_000))), Ok(()));
        }
        assert_eq!(
            book.inbound(t0, 1, &call(9, 1 << 40, Some(60_000))),
            Err(Refused::Calls),
            "the cap holds across the certificate's sessions"
        );
        assert_eq!(
            book.inbound(t0, 3, &call(9, 0, Some(60_000))),
            Ok(()),
            "another certificate"
        );
        // An answer frees a place; so does a timeout passing.
        answer(&mut book, 2, 9, 1);
        assert_eq!(book.inbound(t0, 1, &call(9, 1 << 40, Some(60_000))), Ok(()));
        assert_eq!(
            book.inbound(t0, 1, &call(9, 1 << 41, Some(60_000))),
            Err(Refused::Calls)
        );
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            book.inbound(later, 1, &call(9, 1 << 41, Some(60_000))),
            Ok(())
        );
        assert_eq!(book.totals("mallory").calls, 1);
        // A closed session gives back what it held.
        book.close(1);
        book.close(2);
        assert_eq!(book.totals("mallory"), Totals::default());
    }

    #[test]
    fn a_call_without_a_timeout_or_one_asked_twice_is_refused() {
        let t0 = Instant::now();
        let mut book = Book::new();
        session(&mut book, 1, "mallory");
        assert_eq!(
            book.inbound(t0, 1, &call(9, 1, None)),
            Err(Refused::CallTimeout)
        );
        let long = MAX_CALL_TIMEOUT.as_millis() as u64 + 1;
        assert_eq!(
            book.inbound(t0, 1, &call(9, 1, Some(long))),
            Err(Refused::CallTimeout)
        );
        assert_eq!(book.inbound(t0, 1, &call(9, 1, Some(1_000))), Ok(()));
        assert_eq!(
            book.inbound(t0, 1, &call(9, 1, Some(1_000))),
            Err(Refused::DuplicateCall)
        );
        assert_eq!(book.totals("mallory").calls, 1);
    }

    #[test]
    fn a_peer_cannot_make_a_node_hold_references_or_memberships_past_its_certificates_cap() {
        let t0 = Instant::now();
        let mut book = Book::new();
        session(&mut book, 1, "mallory");
        session(&mut book, 2, "mallory");
        let half = MAX_PROXIES_PER_PRINCIPAL as u64 / 2;
        assert_eq!(book.inbound(t0, 1, &spawn(0..half)), Ok(()));
        assert_eq!(
            book.inbound(t0, 1, &spawn(0..half)),
            Ok(()),
            "announced again: no new reference"
        );
        assert_eq!(
            book.inbound(t0, 2, &spawn(0..half)),
            Ok(()),
            "the other session's own"
        );
        assert_eq!(book.inbound(t0, 2, &spawn([half])), Err(Refused::Proxies));
        assert_eq!(
            book.inbound(t0, 2, &join("g", [half])),
            Err(Refused::Proxies)
        );
        // Stopped actors give their places back.
        let stop = control(ControlMsg::Terminate(Terminate {
            ids: (0..10).collect(),
        }));
        assert_eq!(book.inbound(t0, 2, &stop), Ok(()));
        assert_eq!(book.inbound(t0, 2, &spawn(half..half + 10)), Ok(()));
        assert_eq!(book.totals("mallory").proxies, MAX_PROXIES_PER_PRINCIPAL);

        let mut book = Book::new();
        session(&mut book, 1, "mallory");
        for g in 0..MAX_MEMBERSHIPS_PER_PRINCIPAL {
            assert_eq!(book.inbound(t0, 1, &join(&format!("g{g}"), [1])), Ok(()));
        }
        assert_eq!(
            book.inbound(t0, 1, &join("one more", [1])),
            Err(Refused::Memberships)
        );
        let leave = control(ControlMsg::PgLeave(Pg {
            group: "g0".into(),
            actors: actors([1]),
            scope: "default".into(),
        }));
        assert_eq!(book.inbound(t0, 1, &leave), Ok(()));
        assert_eq!(book.inbound(t0, 1, &join("one more", [1])), Ok(()));
        assert_eq!(
            book.inbound(t0, 1, &join(&"g".repeat(MAX_GROUP_NAME + 1), [1])),
            Err(Refused::GroupName)
        );
        assert_eq!(book.totals("mallory").proxies, 1);
        book.close(1);
        assert_eq!(book.totals("mallory"), Totals::default());
    }

    #[test]
    fn frames_are_cut_whole_from_pieces_and_an_oversized_one_stops_the_stream() {
        let frames = [call(1, 2, Some(5)), spawn([3]), reply(1, 2)];
        let stream: Vec<u8> = frames.concat();
        for piece in [1, 3, 8, 9, 64] {
            let mut s = Splitter::new(1 << 20);
            let mut got = Vec::new();
            for chunk in stream.chunks(piece) {
                s.push(chunk);
                while let Some(f) = s.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, frames, "in pieces of {piece}");
            assert_eq!(s.pending(), 0);
        }
        let mut s = Splitter::new(16);
        s.push(&17u64.to_be_bytes());
        assert_eq!(s.next_frame(), Err(TooLarge { len: 17, max: 16 }));
    }

    #[test]
    fn answers_are_found_among_written_frames_in_any_pieces_without_keeping_payloads() {
        let big = node(NodeMsg::Reply(CallReply {
            to: 1 << 40,
            tag: 0,
            what: vec![7; 100_000],
        }));
        let frames = [
            reply(3, 4),
            call(1, 2, Some(5)),
            big,
            spawn([3]),
            reply(0, 9),
        ];
        let stream = frames.concat();
        for piece in [1, 7, 8, 9, 4096, stream.len()] {
            let mut skim = ReplySkimmer::new();
            let mut got = Vec::new();
            for chunk in stream.chunks(piece) {
                got.extend(skim.push(chunk));
                assert!(skim.head.len() <= HEAD);
            }
            assert_eq!(got, [(3, 4), (1 << 40, 0), (0, 9)], "in pieces of {piece}");
        }
    }

    proptest! {
        /// Any bytes: no panic, and a frame that passes as one kind reads
        /// as protobuf reads it.
        #[test]
        fn any_bytes_read_without_panic_and_as_protobuf_reads_them(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let f = [(body.len() as u64).to_be_bytes().to_vec(), body.clone()].concat();
            if let (Ok(seen), Ok(m)) = (read(&f), NetworkMessage::decode(body.as_slice())) {
                match (seen, m.message) {
                    (
                        Seen::Call { to, tag, timeout_ms },
                        Some(Net::Node(NodeMessage { msg: Some(NodeMsg::Call(c)) })),
                    ) => {
                        prop_assert_eq!((to, tag, timeout_ms), (c.to, c.tag, c.timeout_ms));
                    }
                    (Seen::Call { .. }, _) => prop_assert!(false, "a call protobuf reads otherwise"),
                    (_, Some(Net::Node(NodeMessage { msg: Some(NodeMsg::Call(_)) }))) => {
                        prop_assert!(false, "a call this module does not see");
                    }
                    _ => {}
                }
            }
            let mut s = Splitter::new(1 << 10);
            s.push(&f);
            let _ = s.next_frame();
        }

        /// Calls whatever their order: the count is what is open.
        #[test]
        fn open_calls_are_counted_exactly(ops in proptest::collection::vec((0u64..4, any::<bool>()), 0..200)) {
            let t0 = Instant::now();
            let mut book = Book::new();
            book.open(1, "p");
            let mut open = BTreeSet::new();
            for (tag, ask) in ops {
                if ask {
                    let r = book.inbound(t0, 1, &call(1, tag, Some(1_000)));
                    prop_assert_eq!(r.is_ok(), open.insert(tag));
                } else {
                    answer(&mut book, 1, 1, tag);
                    open.remove(&tag);
                }
                prop_assert_eq!(book.totals("p").calls, open.len());
            }
        }
    }
}
