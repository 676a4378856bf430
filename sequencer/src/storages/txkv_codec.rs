//! The bytes of [`TxKvSeqStorage`](crate::storages::txkv::TxKvSeqStorage): its keys under a prefix,
//! and its values, integers big-endian (so that the byte order of keys is the numeric order;
//! the key table is in the storage's docs).

use crate::engine::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId};
use crate::SeqStorageError;

const NUMBER_TAG: u8 = b'n';
const OFFSET_TAG: u8 = b'o';
const PLOG_TAG: u8 = b'p';
const END_TAG: u8 = b'e';
/// One number of a PLog event: workspace, sequence, number.
const VALUE_BYTES: usize = 8 + 2 + 8;

/// The keys of one storage.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: Vec<u8>,
}

impl Keys {
    pub(crate) fn new(prefix: Vec<u8>) -> Self {
        Keys { prefix }
    }

    fn key(&self, tag: u8, rest: &[u8]) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.len() + 1 + rest.len());
        key.extend_from_slice(&self.prefix);
        key.push(tag);
        key.extend_from_slice(rest);
        key
    }

    /// The highest stored number of `key`.
    pub(crate) fn number(&self, key: NumberKey) -> Vec<u8> {
        let mut rest = [0u8; 10];
        rest[..8].copy_from_slice(&key.ws_id.0.to_be_bytes());
        rest[8..].copy_from_slice(&key.seq_id.0.to_be_bytes());
        self.key(NUMBER_TAG, &rest)
    }

    /// The stored next PLog offset.
    pub(crate) fn offset(&self) -> Vec<u8> {
        self.key(OFFSET_TAG, &[])
    }

    /// The PLog event at `offset`.
    pub(crate) fn plog(&self, offset: PLogOffset) -> Vec<u8> {
        self.key(PLOG_TAG, &offset.0.to_be_bytes())
    }

    /// The PLog's end: the highest appended offset + 1.
    pub(crate) fn end(&self) -> Vec<u8> {
        self.key(END_TAG, &[])
    }
}

/// A stored big-endian `u64`; anything but 8 bytes is corrupt.
pub(crate) fn be_u64(bytes: &[u8], what: &str) -> Result<u64, SeqStorageError> {
    let array: [u8; 8] = bytes.try_into().map_err(|_| SeqStorageError::Corrupt {
        what: format!("{what} of {} bytes, not 8", bytes.len()),
    })?;
    Ok(u64::from_be_bytes(array))
}

/// The writer token that opens every PLog record (see [`encode_event`]).
const WRITER_BYTES: usize = 8;

/// One PLog record: the token of the append call that wrote it (8 bytes), then the event's
/// numbers. The token tells a call's own attempt, whose outcome was unknown, from any other
/// writer's record at the offset, even one with the same numbers. A record of the earlier
/// layout (numbers only: a multiple of 18 bytes, never 8 more than one) decodes as corrupt,
/// never as other numbers.
pub(crate) fn encode_event(writer: u64, values: &[SeqValue]) -> Vec<u8> {
    let mut out = Vec::with_capacity(WRITER_BYTES + values.len() * VALUE_BYTES);
    out.extend_from_slice(&writer.to_be_bytes());
    for v in values {
        out.extend_from_slice(&v.key.ws_id.0.to_be_bytes());
        out.extend_from_slice(&v.key.seq_id.0.to_be_bytes());
        out.extend_from_slice(&v.value.0.to_be_bytes());
    }
    out
}

/// Decodes the numbers of one PLog record into `out` (cleared first).
pub(crate) fn decode_event(bytes: &[u8], out: &mut Vec<SeqValue>) -> Result<(), SeqStorageError> {
    let bytes = match bytes.get(WRITER_BYTES..) {
        Some(values) if values.len().is_multiple_of(VALUE_BYTES) => values,
        _ => {
            return Err(SeqStorageError::Corrupt {
                what: format!("PLog event of {} bytes", bytes.len()),
            })
        }
    };
    out.clear();
    for chunk in bytes.chunks_exact(VALUE_BYTES) {
        let (ws, rest) = chunk.split_at(8);
        let (seq, n) = rest.split_at(2);
        let seq: [u8; 2] = seq.try_into().map_err(|_| SeqStorageError::Corrupt {
            what: "PLog sequence id of the wrong size".into(),
        })?;
        out.push(SeqValue {
            key: NumberKey {
                ws_id: WsId(be_u64(ws, "PLog workspace id")?),
                seq_id: SeqId(u16::from_be_bytes(seq)),
            },
            value: Number(be_u64(n, "PLog number")?),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_decode_to_what_was_encoded_and_damage_is_corrupt() {
        let v = vec![SeqValue {
            key: NumberKey {
                ws_id: WsId(u64::MAX),
                seq_id: SeqId(7),
            },
            value: Number(42),
        }];
        let mut out = Vec::new();
        let record = encode_event(u64::MAX, &v);
        assert_eq!(record.len(), 8 + 18);
        decode_event(&record, &mut out).unwrap();
        assert_eq!(out, v);
        decode_event(&encode_event(3, &[]), &mut out).unwrap();
        assert!(out.is_empty());
        for damaged in [&[1, 2, 3][..], &record[8..], &record[..25]] {
            assert!(
                matches!(
                    decode_event(damaged, &mut out),
                    Err(SeqStorageError::Corrupt { .. })
                ),
                "{damaged:?}"
            );
        }
        assert!(be_u64(&[0; 7], "x").is_err());
    }

    #[test]
    fn keys_order_like_their_numbers_and_stay_under_the_prefix() {
        let keys = Keys::new(b"p/".to_vec());
        let (a, b) = (keys.plog(PLogOffset(255)), keys.plog(PLogOffset(256)));
        assert!(a < b);
        assert!(a.starts_with(b"p/p"));
        assert_ne!(keys.offset(), keys.end());
    }
}
