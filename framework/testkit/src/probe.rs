//! Probe actors for tests: an echo for round-trip checks and a relay that
//! calls another named actor, so a call between two remote actors can be
//! exercised from anywhere in the cluster. The `test-node` binary is the
//! `node` command with these registered; production nodes do not register
//! them.

use std::time::Duration;

use flotilla::ActorKind;
use flotilla::ractor::{self, Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use flotilla::ractor_cluster::RactorClusterMessage;
use flotilla::rkyv::{Archive, Deserialize, Serialize};
use flotilla::wire::Sealed;

/// The kind of [`Echo`].
pub const ECHO: ActorKind<EchoMsg, NoArgs> = ActorKind::new("flotilla.echo");
/// The kind of [`Relay`].
pub const RELAY: ActorKind<RelayMsg, NoArgs> = ActorKind::new("flotilla.relay");
/// The kind of [`Ticker`].
pub const TICKER: ActorKind<TickerMsg, TickerArgs> = ActorKind::new("flotilla.ticker");
/// The kind of [`Lender`].
pub const LENDER: ActorKind<LenderMsg, NoArgs> = ActorKind::new("flotilla.lender");
/// The kind of [`Flooder`].
pub const FLOODER: ActorKind<FlooderMsg, FloodArgs> = ActorKind::new("flotilla.flooder");

/// An opaque payload.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Payload(pub Vec<u8>);

/// A relayed call: ask the actor named `target` to echo `payload`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct RelayRequest {
    /// Name of an [`Echo`] actor anywhere in the cluster.
    pub target: String,
    /// What it should echo.
    pub payload: Vec<u8>,
    /// Timeout of the inner call, in milliseconds.
    pub timeout_ms: u64,
}

/// The relay's answer: the echoed bytes, or why the inner call failed.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub enum RelayReply {
    /// The target echoed these bytes.
    Echoed(Vec<u8>),
    /// The target was not found or did not answer.
    Failed(String),
}

/// What an [`Echo`] has received as notes.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Tally {
    /// Notes received.
    pub notes: u64,
    /// Their payload bytes, all together.
    pub bytes: u64,
    /// Sum of every payload byte, wrapping: a cheap check that large
    /// payloads arrived intact.
    pub checksum: u64,
}

impl Tally {
    /// Adds one note's payload.
    pub fn add(&mut self, payload: &[u8]) {
        self.notes += 1;
        self.bytes += payload.len() as u64;
        self.checksum = payload
            .iter()
            .fold(self.checksum, |sum, b| sum.wrapping_add(u64::from(*b)));
    }
}

/// Arguments of the probe actors (none).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[rkyv(crate = flotilla::rkyv)]
pub struct NoArgs;

/// What a [`Lender`] is asked: put these bytes and lend them to `borrower`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct LendRequest {
    /// The object's bytes.
    pub bytes: Vec<u8>,
    /// The member it is lent to.
    pub borrower: String,
}

/// A [`Lender`]'s answer: the object's reference as text
/// ([`flotilla::ObjectRef::to_token`]), or why it could not lend.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Lent(pub Result<String, String>);

flotilla::remote_type!(
    Payload,
    RelayRequest,
    RelayReply,
    NoArgs,
    Tally,
    LendRequest,
    Lent
);

/// Messages of [`Echo`].
#[derive(RactorClusterMessage)]
pub enum EchoMsg {
    /// Fire and forget: counted, not answered.
    Note(Payload),
    /// A note whose payload is read in place where it lands; tallied with
    /// the notes.
    SealedNote(Sealed<Payload>),
    /// Answer with the same payload.
    #[rpc]
    Echo(Payload, RpcReplyPort<Payload>),
    /// How many notes arrived.
    #[rpc]
    Notes(RpcReplyPort<u64>),
    /// What arrived as notes: count, bytes and checksum.
    #[rpc]
    Tally(RpcReplyPort<Tally>),
}

/// Echoes payloads back.
pub struct Echo;

impl Actor for Echo {
    type Msg = EchoMsg;
    type State = Tally;
    type Arguments = NoArgs;

    async fn pre_start(
        &self,
        _me: ActorRef<EchoMsg>,
        _args: NoArgs,
    ) -> Result<Tally, ActorProcessingErr> {
        Ok(Tally::default())
    }

    async fn handle(
        &self,
        _me: ActorRef<EchoMsg>,
        msg: EchoMsg,
        tally: &mut Tally,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            EchoMsg::Note(p) => tally.add(&p.0),
            EchoMsg::SealedNote(p) => tally.add(p.get().0.as_slice()),
            EchoMsg::Echo(p, reply) => {
                let _ = reply.send(p);
            }
            EchoMsg::Notes(reply) => {
                let _ = reply.send(tally.notes);
            }
            EchoMsg::Tally(reply) => {
                let _ = reply.send(*tally);
            }
        }
        Ok(())
    }
}

/// Messages of [`Lender`].
#[derive(RactorClusterMessage)]
pub enum LenderMsg {
    /// Put the bytes in this node's store and lend them.
    #[rpc]
    Lend(LendRequest, RpcReplyPort<Lent>),
}

/// Puts objects in its node's store and lends them to whom it is told: a
/// lender on another node, for the tests of who may release what.
pub struct Lender {
    node: flotilla::NodeHandle,
}

impl Actor for Lender {
    type Msg = LenderMsg;
    type State = ();
    type Arguments = NoArgs;

    async fn pre_start(
        &self,
        _me: ActorRef<LenderMsg>,
        _: NoArgs,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _me: ActorRef<LenderMsg>,
        msg: LenderMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let LenderMsg::Lend(req, reply) = msg;
        let lent = match self.node.get() {
            None => Err("the lender runs outside a node".to_owned()),
            Some(node) => match node.objects().put(&req.bytes).await {
                Ok(object) => Ok(node
                    .objects()
                    .lend(object, &req.borrower, Duration::from_secs(600))
                    .to_token()),
                Err(e) => Err(e.to_string()),
            },
        };
        let _ = reply.send(Lent(lent));
        Ok(())
    }
}

/// An echo that also reports every message it receives on a channel: what
/// a test puts where a message must never arrive.
pub struct Recorder;

impl Actor for Recorder {
    type Msg = EchoMsg;
    type State = tokio::sync::mpsc::UnboundedSender<()>;
    type Arguments = tokio::sync::mpsc::UnboundedSender<()>;

    async fn pre_start(
        &self,
        _me: ActorRef<EchoMsg>,
        seen: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(seen)
    }

    async fn handle(
        &self,
        _me: ActorRef<EchoMsg>,
        msg: EchoMsg,
        seen: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _ = seen.send(());
        if let EchoMsg::Echo(p, reply) = msg {
            let _ = reply.send(p);
        }
        Ok(())
    }
}

/// Messages of [`Relay`].
#[derive(RactorClusterMessage)]
pub enum RelayMsg {
    /// Call the target echo and answer with its reply.
    #[rpc]
    Relay(RelayRequest, RpcReplyPort<RelayReply>),
}

/// Calls another named actor on behalf of its caller.
pub struct Relay;

impl Actor for Relay {
    type Msg = RelayMsg;
    type State = ();
    type Arguments = NoArgs;

    async fn pre_start(
        &self,
        _me: ActorRef<RelayMsg>,
        _args: NoArgs,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle(
        &self,
        _me: ActorRef<RelayMsg>,
        msg: RelayMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let RelayMsg::Relay(req, reply) = msg;
        // Answer from a task so a slow target never blocks this mailbox.
        tokio::spawn(async move {
            let answer = match ractor::pg::get_members(&req.target).first() {
                None => RelayReply::Failed(format!("no actor named {:?}", req.target)),
                Some(cell) => {
                    let target: ActorRef<EchoMsg> = cell.clone().into();
                    match flotilla::call::call(
                        &target,
                        |port| EchoMsg::Echo(Payload(req.payload), port),
                        Duration::from_millis(req.timeout_ms),
                    )
                    .await
                    {
                        Ok(p) => RelayReply::Echoed(p.0),
                        Err(e) => RelayReply::Failed(e.to_string()),
                    }
                }
            };
            let _ = reply.send(answer);
        });
        Ok(())
    }
}

/// One process group a [`Flooder`] fills: `actors` new echoes joined to
/// `name` at once.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct FloodGroup {
    /// The group.
    pub name: String,
    /// How many echoes join it.
    pub actors: u32,
}

/// A [`Flooder`]'s arguments: the groups it fills, in order.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct FloodArgs(pub Vec<FloodGroup>);

flotilla::remote_type!(FloodGroup, FloodArgs);

/// Messages of [`Flooder`].
#[derive(RactorClusterMessage)]
pub enum FlooderMsg {
    /// How many echoes it started.
    #[rpc]
    Started(RpcReplyPort<u64>),
}

/// Starts echoes and joins them to process groups, each group at once:
/// a node whose every session announces them to its peers, for the tests
/// of what one certificate may make other nodes hold. Its echoes stop
/// with it.
pub struct Flooder;

impl Actor for Flooder {
    type Msg = FlooderMsg;
    type State = u64;
    type Arguments = FloodArgs;

    async fn pre_start(
        &self,
        me: ActorRef<FlooderMsg>,
        FloodArgs(groups): FloodArgs,
    ) -> Result<u64, ActorProcessingErr> {
        let mut started = 0;
        for group in groups {
            let mut cells = Vec::with_capacity(group.actors as usize);
            for _ in 0..group.actors {
                let (echo, _) = Actor::spawn_linked(None, Echo, NoArgs, me.get_cell()).await?;
                cells.push(echo.get_cell());
            }
            started += cells.len() as u64;
            ractor::pg::join(group.name, cells);
        }
        Ok(started)
    }

    async fn handle(
        &self,
        _me: ActorRef<FlooderMsg>,
        FlooderMsg::Started(reply): FlooderMsg,
        started: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        let _ = reply.send(*started);
        Ok(())
    }
}

/// Registers the probe kinds on a node builder.
pub fn register(builder: flotilla::NodeBuilder) -> flotilla::NodeBuilder {
    let node = builder.node_handle();
    builder
        .register(ECHO, || Echo)
        .register(FLOODER, || Flooder)
        .register(RELAY, || Relay)
        .register(LENDER, move || Lender { node: node.clone() })
        .register_configurable(TICKER, || Ticker)
        .fences_checkpoints(TICKER)
}

/// A [`Ticker`]'s arguments, written in `node.toml` as the child's `args`
/// (with `checkpoint` set from the child's `checkpoint`).
#[derive(Archive, Serialize, Deserialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct TickerArgs {
    /// Where its snapshots go (a folder or an object store URL).
    pub checkpoint: String,
    /// Milliseconds between ticks.
    pub tick_ms: u64,
    /// Ticks between snapshots.
    pub every: u64,
    /// This start as its node wrote it (its supervisor's epoch and
    /// certificate; unfenced when spawned without a supervisor). Never
    /// read from configuration.
    #[serde(skip)]
    pub start: flotilla::checkpoint::Start,
}

impl flotilla::checkpoint::TakesStart for TickerArgs {
    fn start_mut(&mut self) -> &mut flotilla::checkpoint::Start {
        &mut self.start
    }
}

/// What a [`Ticker`] answers: its count.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[rkyv(crate = flotilla::rkyv)]
pub struct Ticks(pub u64);

flotilla::remote_type!(TickerArgs, Ticks);

/// Messages of [`Ticker`].
#[derive(RactorClusterMessage)]
pub enum TickerMsg {
    /// One tick (sent by itself).
    Tick,
    /// Its count.
    #[rpc]
    Count(RpcReplyPort<Ticks>),
}

/// A checkpointing counter that counts its own ticks: on start it
/// restores its newest snapshot (logging `ticker restored` with the count)
/// and saves one every `every` ticks, under its actor name.
pub struct Ticker;

/// A [`Ticker`]'s state.
pub struct TickerState {
    store: Snapshots,
    every: u64,
    n: u64,
}

/// Where a ticker saves: fenced by its start's epoch, or not.
enum Snapshots {
    Fenced(flotilla::checkpoint::Fenced),
    Plain(flotilla::checkpoint::CheckpointStore, String),
}

impl Snapshots {
    async fn save(&self, n: u64) -> Result<(), flotilla::checkpoint::CheckpointError> {
        match self {
            Self::Fenced(f) => f.save(n, &Ticks(n)).await,
            Self::Plain(store, key) => store.save(key, n, &Ticks(n)).await,
        }
    }
}

impl Actor for Ticker {
    type Msg = TickerMsg;
    type State = TickerState;
    type Arguments = TickerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<TickerMsg>,
        args: TickerArgs,
    ) -> Result<TickerState, ActorProcessingErr> {
        let store = flotilla::checkpoint::CheckpointStore::open(&args.checkpoint, 3)?;
        let key = myself.get_name().unwrap_or_else(|| "ticker".to_owned());
        let (store, restored) = if args.start.is_fenced() {
            let fenced = store.fence(&key, &args.start).await?;
            let restored = fenced.restore::<Ticks>().await?;
            (Snapshots::Fenced(fenced), restored)
        } else {
            let restored = store.restore::<Ticks>(&key).await?;
            (Snapshots::Plain(store, key.clone()), restored)
        };
        let n = restored.map_or(0, |(_, Ticks(n))| n);
        tracing::info!(name = %key, count = n, epoch = args.start.epoch().micros(), issuer = %args.start.issuer(), "ticker restored");
        myself.send_interval(Duration::from_millis(args.tick_ms.max(1)), || {
            TickerMsg::Tick
        });
        Ok(TickerState {
            store,
            every: args.every.max(1),
            n,
        })
    }

    async fn handle(
        &self,
        _: ActorRef<TickerMsg>,
        msg: TickerMsg,
        state: &mut TickerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TickerMsg::Tick => {
                state.n += 1;
                if state.n.is_multiple_of(state.every) {
                    // A stale copy's save is refused: it stops here.
                    state.store.save(state.n).await?;
                }
            }
            TickerMsg::Count(reply) => {
                let _ = reply.send(Ticks(state.n));
            }
        }
        Ok(())
    }
}
