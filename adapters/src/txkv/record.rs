//! What one slot's key holds: a live record, or the tombstone of a deleted one (which keeps the
//! revision, so that a re-insert goes higher). Times are never stored, only the holder's TTL.
//!
//! ```text
//! live:      0x01 'L' <revision: u64 BE> <ttl ns: u64 BE> <value bytes>
//! deleted:   0x01 'D' <revision: u64 BE>
//! holding:   0x01 'H' <revision: u64 BE> <session incarnation: u64 BE> <session id: u64 BE> <value bytes>
//! ```
//!
//! A holding has no TTL: it is live while its session's record (a live record under the
//! session's key) is. A process of a version before holdings reads one as no record of this
//! format: live for ever and never overwritten, so it never takes a slot a session holds.

use std::time::Duration;

use vvm_core::{Incarnation, SessionId, SessionKey};

const VERSION: u8 = 1;
const LIVE: u8 = b'L';
const DELETED: u8 = b'D';
const HELD: u8 = b'H';
const HEADER_BYTES: usize = 2 + 8;

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Record {
    /// Written with a TTL; live until its holder stops renewing it for a whole TTL.
    Live {
        revision: u64,
        ttl: Duration,
        value: Vec<u8>,
    },
    /// Deleted at `revision`.
    Deleted { revision: u64 },
    /// A holding of `session`, live while the session's record is.
    Held {
        revision: u64,
        session: SessionKey,
        value: Vec<u8>,
    },
}

impl Record {
    pub(super) fn encode(&self) -> Vec<u8> {
        match self {
            Record::Live {
                revision,
                ttl,
                value,
            } => {
                let ttl_ns = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
                let mut bytes = Vec::with_capacity(HEADER_BYTES + 8 + value.len());
                bytes.extend_from_slice(&[VERSION, LIVE]);
                bytes.extend_from_slice(&revision.to_be_bytes());
                bytes.extend_from_slice(&ttl_ns.to_be_bytes());
                bytes.extend_from_slice(value);
                bytes
            }
            Record::Held {
                revision,
                session,
                value,
            } => {
                let mut bytes = Vec::with_capacity(HEADER_BYTES + 16 + value.len());
                bytes.extend_from_slice(&[VERSION, HELD]);
                bytes.extend_from_slice(&revision.to_be_bytes());
                bytes.extend_from_slice(&session.incarnation.0.to_be_bytes());
                bytes.extend_from_slice(&session.id.0.to_be_bytes());
                bytes.extend_from_slice(value);
                bytes
            }
            Record::Deleted { revision } => {
                let mut bytes = Vec::with_capacity(HEADER_BYTES);
                bytes.extend_from_slice(&[VERSION, DELETED]);
                bytes.extend_from_slice(&revision.to_be_bytes());
                bytes
            }
        }
    }

    /// What the slot's tenure key keeps of this record (`Tx.RecordRemoved`): the record itself,
    /// so that its removal from outside is judged as the record (a slot record by observation, a
    /// holding while its session lives); a tombstone keeps the revision, so that revisions keep
    /// rising.
    pub(super) fn tenure(&self) -> Record {
        self.clone()
    }

    /// `None` when the bytes are no record of this format.
    pub(super) fn decode(bytes: &[u8]) -> Option<Record> {
        let (&[version, kind], rest) = split::<2>(bytes)?;
        if version != VERSION {
            return None;
        }
        let (revision, rest) = split::<8>(rest)?;
        let revision = u64::from_be_bytes(*revision);
        match kind {
            LIVE => {
                let (ttl_ns, value) = split::<8>(rest)?;
                Some(Record::Live {
                    revision,
                    ttl: Duration::from_nanos(u64::from_be_bytes(*ttl_ns)),
                    value: value.to_vec(),
                })
            }
            DELETED if rest.is_empty() => Some(Record::Deleted { revision }),
            HELD => {
                let (incarnation, rest) = split::<8>(rest)?;
                let (id, value) = split::<8>(rest)?;
                Some(Record::Held {
                    revision,
                    session: SessionKey {
                        incarnation: Incarnation(u64::from_be_bytes(*incarnation)),
                        id: SessionId(u64::from_be_bytes(*id)),
                    },
                    value: value.to_vec(),
                })
            }
            _ => None,
        }
    }
}

fn split<const N: usize>(bytes: &[u8]) -> Option<(&[u8; N], &[u8])> {
    let (head, rest) = bytes.split_at_checked(N)?;
    Some((head.try_into().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_anything_else_is_refused() {
        let live = Record::Live {
            revision: 7,
            ttl: Duration::from_millis(2500),
            value: b"vvm1 x".to_vec(),
        };
        let deleted = Record::Deleted { revision: 9 };
        let held = Record::Held {
            revision: 11,
            session: SessionKey {
                incarnation: Incarnation(3),
                id: SessionId(4),
            },
            value: b"vvm1 y".to_vec(),
        };
        assert_eq!(Record::decode(&held.encode()), Some(held.clone()));
        assert_eq!(Record::decode(&held.encode()[..HEADER_BYTES + 15]), None);
        assert_eq!(Record::decode(&live.encode()), Some(live.clone()));
        assert_eq!(Record::decode(&deleted.encode()), Some(deleted.clone()));
        let mut wrong_version = live.encode();
        wrong_version[0] = 2;
        let mut trailing = deleted.encode();
        trailing.push(0);
        for bad in [
            &b""[..],
            b"\x01",
            b"\x01L\x00",
            &wrong_version,
            &trailing,
            b"\x01X\x00\x00\x00\x00\x00\x00\x00\x01",
        ] {
            assert_eq!(Record::decode(bad), None, "{bad:?}");
        }
        assert_eq!(Record::decode(&live.encode()[..HEADER_BYTES + 7]), None);
    }
}
