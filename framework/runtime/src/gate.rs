//! The gate every accepted stream passes: the hello is checked against the
//! peer's certificate, this node's cookie, the purposes the endpoint
//! serves, and what the member table holds of the peer's incarnation (a
//! stream from an incarnation that is down, left or replaced is refused).
//! Every refusal is logged by the caller and counted here.
//!
//! ```text
//! accept_bi ─► Hello ─► Gate::check ─┬─ Accepted ─► stream
//!                        ▲           └─ Refused(reason) ─► counted, closed
//!   identity (name, incarnation, cookie) · watch<Table> (peer incarnations)
//! ```

use flotilla_proto::hello::{Hello, Purpose};
use flotilla_transport::PeerConnection;
use flotilla_transport::handshake::{self, Gate, StreamError};
use quinn::{RecvStream, SendStream};
use tokio::sync::watch;

use crate::counters;
use crate::identity::Identity;
use crate::table::Table;

/// Accepts the next stream `pc`'s peer opens on an endpoint serving
/// `serves`, checked against `identity` and the peers' incarnations in
/// `view`.
pub(crate) async fn accept(
    identity: &Identity,
    view: &watch::Receiver<Table>,
    pc: &PeerConnection,
    serves: &[Purpose],
) -> Result<(SendStream, RecvStream, Hello), StreamError> {
    let known = |name: &str| view.borrow().known(name);
    let gate = Gate {
        name: &identity.name,
        incarnation: identity.incarnation(),
        cookie: identity.cookie,
        serves,
        known: &known,
    };
    let accepted = handshake::accept(&pc.connection, &pc.peer, &gate).await;
    if let Err(StreamError::RefusedPeer(refusal)) = &accepted {
        counters::hello_refused(*refusal);
    }
    accepted
}
