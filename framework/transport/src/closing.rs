//! Why a connection is closed: one QUIC application close code per reason,
//! so the peer that sees the close can say what happened ("this
//! certificate is revoked") rather than "connection closed".
//!
//! ```
//! use flotilla_transport::closing::Closing;
//!
//! assert_eq!(Closing::from_code(Closing::Revoked.code()), Some(Closing::Revoked));
//! assert!(Closing::Revoked.to_string().starts_with("NODE-AUTH-020"));
//! assert_eq!(Closing::from_code(0xffff), None);
//! ```

/// A reason a node closes a peer's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Closing {
    /// The exchange is over.
    #[error("the peer closed the connection: the exchange is over")]
    Done,
    /// The node is shutting down.
    #[error("NODE-WIRE-006: the peer is shutting down")]
    Shutdown,
    /// The certificate names no node.
    #[error("NODE-AUTH-003: the peer closed the connection: this certificate names no node")]
    NoName,
    /// The certificate's role is not the one the dialler asked for.
    #[error(
        "NODE-AUTH-021: the peer closed the connection: this certificate has another role than it expected"
    )]
    UnexpectedRole,
    /// A frame over the limit or cut short.
    #[error("NODE-WIRE-003: the peer closed the connection after a malformed frame")]
    MalformedFrame,
    /// An archive that failed validation.
    #[error(
        "NODE-WIRE-003: the peer closed the connection after an archive that failed validation"
    )]
    MalformedArchive,
    /// The hello was refused (the refusal itself travels on the stream).
    #[error("NODE-WIRE-002: the peer refused the hello")]
    Refused,
    /// A stream broke under the exchange.
    #[error("NODE-WIRE-002: the peer closed the connection after a broken stream")]
    BrokenStream,
    /// No hello came in time.
    #[error("NODE-WIRE-005: the peer closed the connection: no hello in time")]
    HelloTimeout,
    /// The certificate expired while the connection was open.
    #[error(
        "NODE-AUTH-027: the peer closed the connection: this certificate has expired; renew it (node certs renew)"
    )]
    Expired,
    /// The certificate is revoked.
    #[error(
        "NODE-AUTH-020: the peer closed the connection: this certificate has been revoked; issue a new one with `node certs issue`"
    )]
    Revoked,
    /// The member incarnation speaking on it is no longer up.
    #[error(
        "NODE-AUTH-023: the peer closed the connection: this member incarnation is no longer up; join again"
    )]
    Fenced,
    /// The connection opened no stream in time.
    #[error("NODE-WIRE-005: the peer closed the connection: no stream opened in time")]
    NoStream,
    /// The certificate holds as many connections to the node as it may.
    #[error(
        "NODE-AUTH-029: the peer closed the connection: this certificate holds as many connections to it as it may; close some"
    )]
    TooManyConnections,
}

impl Closing {
    const ALL: [Closing; 14] = [
        Self::Done,
        Self::Shutdown,
        Self::NoName,
        Self::UnexpectedRole,
        Self::MalformedFrame,
        Self::MalformedArchive,
        Self::Refused,
        Self::BrokenStream,
        Self::HelloTimeout,
        Self::Expired,
        Self::Revoked,
        Self::Fenced,
        Self::NoStream,
        Self::TooManyConnections,
    ];

    /// The application close code on the wire.
    pub fn code(self) -> u32 {
        match self {
            Self::Done => 0x00,
            Self::Shutdown => 0x01,
            Self::NoName => 0x03,
            Self::UnexpectedRole => 0x04,
            Self::MalformedFrame => 0x10,
            Self::MalformedArchive => 0x11,
            Self::Refused => 0x12,
            Self::BrokenStream => 0x13,
            Self::HelloTimeout => 0x14,
            Self::Expired => 0x15,
            Self::Revoked => 0x16,
            Self::Fenced => 0x17,
            Self::NoStream => 0x18,
            Self::TooManyConnections => 0x19,
        }
    }

    /// The short reason sent beside the code.
    pub fn reason(self) -> &'static [u8] {
        match self {
            Self::Done => b"done",
            Self::Shutdown => b"shutdown",
            Self::NoName => b"no node name",
            Self::UnexpectedRole => b"unexpected role",
            Self::MalformedFrame => b"malformed frame",
            Self::MalformedArchive => b"malformed archive",
            Self::Refused => b"refused",
            Self::BrokenStream => b"broken stream",
            Self::HelloTimeout => b"no hello",
            Self::Expired => b"expired",
            Self::Revoked => b"revoked",
            Self::Fenced => b"fenced",
            Self::NoStream => b"no stream",
            Self::TooManyConnections => b"too many connections",
        }
    }

    /// The reason a close `code` stands for; `None` for codes this
    /// version does not know.
    pub fn from_code(code: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.code() == code)
    }

    /// Why the peer closed `error`'s connection, where it did so with a
    /// known code.
    pub fn of(error: &quinn::ConnectionError) -> Option<Self> {
        match error {
            quinn::ConnectionError::ApplicationClosed(close) => {
                u32::try_from(close.error_code.into_inner())
                    .ok()
                    .and_then(Self::from_code)
            }
            _ => None,
        }
    }

    /// Closes `connection` for this reason.
    pub fn close(self, connection: &quinn::Connection) {
        connection.close(quinn::VarInt::from_u32(self.code()), self.reason());
    }

    /// Closes every connection of `endpoint` for this reason.
    pub fn close_all(self, endpoint: &quinn::Endpoint) {
        endpoint.close(quinn::VarInt::from_u32(self.code()), self.reason());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_code_and_comes_back_from_it() {
        let mut codes: Vec<u32> = Closing::ALL.iter().map(|c| c.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Closing::ALL.len());
        for c in Closing::ALL {
            assert_eq!(Closing::from_code(c.code()), Some(c));
            assert!(!c.reason().is_empty());
        }
    }

    #[test]
    fn a_close_by_the_peer_with_a_known_code_is_named_and_other_ends_are_not() {
        let close = |code: u32| {
            quinn::ConnectionError::ApplicationClosed(quinn::ApplicationClose {
                error_code: quinn::VarInt::from_u32(code),
                reason: b"whatever"[..].into(),
            })
        };
        assert_eq!(Closing::of(&close(0x16)), Some(Closing::Revoked));
        assert_eq!(Closing::of(&close(0x4242)), None);
        assert_eq!(Closing::of(&quinn::ConnectionError::TimedOut), None);
        assert_eq!(Closing::of(&quinn::ConnectionError::LocallyClosed), None);
    }
}
