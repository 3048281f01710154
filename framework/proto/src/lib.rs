//! Flotilla's protocol and policy logic, free of I/O.
//!
//! Every machine here is a plain value: events go in with the current time
//! passed by the caller, decisions come out. No sockets, no clocks, no tokio,
//! quinn or ractor in the dependency tree, so each piece is tested
//! exhaustively without a network.
//!
//! ```text
//! authority   who may ask what of a node: the permission table
//! bulk        large messages on their own stream
//! control     join, heartbeats and status requests to the head
//! epoch       fencing tokens of a supervised child's starts, and the store's rule
//! frame       length prefixes checked against a limit before any allocation
//! groups      the head's placement groups: two-phase reservation, pending, re-placement
//! wire        rkyv archives, validated (bytecheck) before they are read
//! hello       the first frame of every connection: who speaks, and why
//! incarnation the generation a node runs under, increasing across restarts
//! jobs        detached jobs: an actor the head runs in a bundle of its own
//! job_state   where a detached job is: pending, running, or at its end
//! job_stats   a batch job's account of itself, and its series on `/metrics`
//! lease       which head of a set is active: a lease on a store with conditional writes
//! ledger      a node's reservations for the bundles of placement groups
//! membership  the member table, incarnations and the failure detector
//! head        the head's side of a control stream
//! member      a member's side of its control stream: join, heartbeat, leave
//! objects     pulling an object from its owner; the object store's counters
//! mesh        which ractor sessions a node dials, re-dials and closes
//! placement   where a placement group's bundles go: PACK, SPREAD, STRICT_*
//! resources   what a node offers: CPUs, memory, GPUs, labels
//! role        a certificate's role, and the member names its processes speak as
//! roots       where a node lets detached jobs read and write
//! supervision restart policy: intensity, backoff, strategies, shutdown timeouts
//! window      the batch pipeline's credit window: routing, deadlines, retries
//! ```

#![warn(clippy::too_many_lines)]

pub mod authority;
pub mod bulk;
pub mod cluster_frames;
pub mod codes;
pub mod control;
pub mod epoch;
pub mod frame;
pub mod groups;
pub mod head;
pub mod hello;
pub mod ids;
pub mod incarnation;
pub mod job_state;
pub mod job_stats;
pub mod jobs;
pub mod lease;
pub mod ledger;
pub mod member;
pub mod membership;
pub mod mesh;
pub mod objects;
pub mod placement;
pub mod resources;
pub mod role;
pub mod roots;
pub mod supervision;
pub mod window;
pub mod wire;
