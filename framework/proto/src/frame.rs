//! Length-prefixed frames: a 4-byte big-endian length, then the payload.
//!
//! The length is checked against a limit before anything is allocated, so a
//! peer cannot make a node reserve memory by announcing a large frame.

/// Default largest frame payload on Flotilla's own streams (hello, control).
pub const DEFAULT_MAX_FRAME: u32 = 1 << 20;

/// Size of the length prefix in bytes.
pub const PREFIX_LEN: usize = 4;

/// A frame that cannot be accepted. The peer misbehaved: close the
/// connection, never retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The announced length exceeds the limit; nothing was allocated.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced payload length.
        len: u64,
        /// The limit in force.
        max: u32,
    },
    /// The stream ended inside a frame.
    #[error("stream ended after {got} of {want} bytes of a frame")]
    Truncated {
        /// Bytes received.
        got: usize,
        /// Bytes the frame needed.
        want: usize,
    },
}

/// Checks a received length prefix against `max` and returns the payload
/// length to read.
pub fn payload_len(prefix: [u8; PREFIX_LEN], max: u32) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(prefix);
    if len > max {
        return Err(FrameError::TooLarge {
            len: u64::from(len),
            max,
        });
    }
    Ok(len as usize)
}

/// Prefixes `payload` with its length, refusing payloads over `max`.
pub fn encode(payload: &[u8], max: u32) -> Result<Vec<u8>, FrameError> {
    let len = u64::try_from(payload.len()).unwrap_or(u64::MAX);
    if len > u64::from(max) {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut out = Vec::with_capacity(PREFIX_LEN + payload.len());
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Splits one complete frame off the front of `buf`: `Ok(None)` when more
/// bytes are needed, the payload and the bytes consumed otherwise.
pub fn decode(buf: &[u8], max: u32) -> Result<Option<(&[u8], usize)>, FrameError> {
    let Some(prefix) = buf.first_chunk::<PREFIX_LEN>() else {
        return Ok(None);
    };
    let len = payload_len(*prefix, max)?;
    let end = PREFIX_LEN + len;
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((&buf[PREFIX_LEN..end], end)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frame_at_the_limit_is_accepted() {
        let payload = vec![7u8; 64];
        let framed = encode(&payload, 64).unwrap();
        assert_eq!(decode(&framed, 64).unwrap(), Some((&payload[..], 68)));
    }

    #[test]
    fn oversized_frame_is_rejected_before_read() {
        let prefix = 65u32.to_be_bytes();
        assert_eq!(
            payload_len(prefix, 64),
            Err(FrameError::TooLarge { len: 65, max: 64 })
        );
        // Only the prefix is present: the error comes without the payload.
        assert!(decode(&prefix, 64).is_err());
        assert!(encode(&[0; 65], 64).is_err());
    }

    #[test]
    fn max_length_prefix_is_rejected() {
        let prefix = u32::MAX.to_be_bytes();
        assert_eq!(
            payload_len(prefix, DEFAULT_MAX_FRAME),
            Err(FrameError::TooLarge {
                len: u64::from(u32::MAX),
                max: DEFAULT_MAX_FRAME
            })
        );
    }

    #[test]
    fn truncated_frame_waits_for_more() {
        let framed = encode(b"hello", 64).unwrap();
        for cut in 0..framed.len() {
            assert_eq!(decode(&framed[..cut], 64).unwrap(), None, "cut at {cut}");
        }
    }

    proptest! {
        #[test]
        fn frames_round_trip_back_to_back(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8)) {
            let mut stream = Vec::new();
            for p in &payloads {
                stream.extend(encode(p, 300).unwrap());
            }
            let mut rest = &stream[..];
            for p in &payloads {
                let (got, used) = decode(rest, 300).unwrap().unwrap();
                prop_assert_eq!(got, &p[..]);
                rest = &rest[used..];
            }
            prop_assert!(rest.is_empty());
        }
    }
}
