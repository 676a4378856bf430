//! The byte form of a semaphore, for stores that keep values as bytes (the transactional
//! key-value model, etcd, SQLite blobs).
//!
//! Version 2, integers little-endian, no padding, lengths before what they measure:
//!
//! ```text
//! "vSM" 0x02                         magic and version
//! flags u8                           bit 0: ephemeral; bit 1: being deleted; the others 0
//! name_len u8, name                  UTF-8
//! limit u64, generation u64, next_order_id u64
//! data_len u16, data
//! owners u16, waiters u16
//! owner:  order_id u64, incarnation u64, session u64, count u64, timeout_ms u64, request u64,
//!         token u64, data_len u16, data                    (owners in order, then waiters)
//! waiter: order_id u64, incarnation u64, session u64, count u64, timeout_ms u64, request u64,
//!         data_len u16, data
//! ```
//!
//! Version 1 is the same without the parties' `request` fields; it still decodes, each party
//! with request 0 (older than any call a session makes), and is written back as version 2.
//!
//! Bit 1 is set only while a semaphore is being deleted ([`Semaphore::delete`]), so every
//! other record is byte for byte what binaries before it wrote and read; a record without it
//! decodes as not being deleted. A binary before bit 1 refuses a record with it
//! ([`DecodeError::Flags`]; the store reports the semaphore corrupt and leaves it as it is)
//! rather than read it as an ordinary semaphore and grant units its former owners still use.
//!
//! Decoding reads lengths before allocating and refuses any length above its bound, so hostile
//! bytes cost at most [`ENCODED_BYTES_MAX`](super::ENCODED_BYTES_MAX) of memory; then the state
//! must obey every rule ([`Semaphore::check_invariants`]). Whatever decodes from version 2,
//! encodes back to the same bytes.

use super::{
    Generation, NameError, OrderId, Owner, RequestId, Semaphore, SemaphoreName, SessionKey,
    Violation, Waiter, DATA_BYTES_MAX, PARTIES_MAX, PARTY_DATA_BYTES_MAX,
};
use crate::session::SessionId;
use crate::Incarnation;

const MAGIC: [u8; 3] = *b"vSM";
const VERSION: u8 = 2;
/// The version before parties carried their [`RequestId`].
const VERSION_1: u8 = 1;
const EPHEMERAL: u8 = 1;
/// Being deleted ([`Semaphore::is_deleting`]).
const DELETING: u8 = 2;

/// Fixed bytes of the encoding outside the name, the data and the parties.
pub(super) const HEADER_BYTES: usize = 4 + 1 + 1 + 3 * 8 + 2 + 2 * 2;
/// Fixed bytes of one owner (a waiter has 8 fewer).
pub(super) const OWNER_BYTES: usize = 7 * 8 + 2;

const _: () = assert!(DATA_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(PARTY_DATA_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(PARTIES_MAX <= u16::MAX as usize);

/// Why bytes are not a semaphore.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes do not start with the semaphore magic.
    #[error("not a semaphore")]
    Magic,
    /// A version this code does not read.
    #[error("semaphore encoding version {0} is not known")]
    Version(u8),
    /// Flag bits that no version sets.
    #[error("unknown flags {0:#04x}")]
    Flags(u8),
    /// The bytes end inside a field.
    #[error("the bytes end early")]
    Truncated,
    /// Bytes follow the last party.
    #[error("{0} bytes after the end")]
    Trailing(usize),
    /// The name is not UTF-8.
    #[error("the name is not UTF-8")]
    NameNotUtf8,
    /// The name is not a valid [`SemaphoreName`].
    #[error("invalid name")]
    Name(#[from] NameError),
    /// A length above its bound: data, or the number of parties.
    #[error("a length above its bound")]
    TooLong,
    /// The fields decode but break a rule of semaphore states.
    #[error("not a valid semaphore state")]
    Invalid(#[from] Violation),
}

impl Semaphore {
    /// The state as bytes (version 2); at most [`ENCODED_BYTES_MAX`](super::ENCODED_BYTES_MAX).
    pub fn encode(&self) -> Vec<u8> {
        let parties: usize = self
            .owners
            .iter()
            .map(|o| OWNER_BYTES + o.data.len())
            .sum::<usize>()
            + self
                .waiters
                .iter()
                .map(|w| OWNER_BYTES - 8 + w.data.len())
                .sum::<usize>();
        let mut out =
            Vec::with_capacity(HEADER_BYTES + self.name.as_str().len() + self.data.len() + parties);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        let ephemeral = if self.ephemeral { EPHEMERAL } else { 0 };
        out.push(ephemeral | if self.deleting { DELETING } else { 0 });
        let name = self.name.as_str().as_bytes();
        // The name's length is at most NAME_BYTES_MAX = 255, the data's and the numbers of
        // parties within u16 (asserted above): the casts keep every bit.
        out.push(name.len() as u8);
        out.extend_from_slice(name);
        for n in [self.limit, self.generation.0, self.next_order_id.0] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        put_bytes(&mut out, &self.data);
        out.extend_from_slice(&(self.owners.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.waiters.len() as u16).to_le_bytes());
        for o in &self.owners {
            put_party(&mut out, o.order_id, o.session, o.count, o.timeout_ms);
            out.extend_from_slice(&o.request.0.to_le_bytes());
            out.extend_from_slice(&o.token.0.to_le_bytes());
            put_bytes(&mut out, &o.data);
        }
        for w in &self.waiters {
            put_party(&mut out, w.order_id, w.session, w.count, w.timeout_ms);
            out.extend_from_slice(&w.request.0.to_le_bytes());
            put_bytes(&mut out, &w.data);
        }
        out
    }

    /// A state from bytes [`encode`](Self::encode) wrote (this version or version 1); anything
    /// else is refused with the reason.
    pub fn decode(bytes: &[u8]) -> Result<Semaphore, DecodeError> {
        let mut r = Reader { bytes };
        if r.take(3)? != MAGIC {
            return Err(DecodeError::Magic);
        }
        let with_requests = match r.u8()? {
            VERSION => true,
            VERSION_1 => false,
            other => return Err(DecodeError::Version(other)),
        };
        let read_request = |r: &mut Reader<'_>| -> Result<RequestId, DecodeError> {
            Ok(RequestId(if with_requests { r.u64()? } else { 0 }))
        };
        let flags = r.u8()?;
        if flags & !(EPHEMERAL | DELETING) != 0 {
            return Err(DecodeError::Flags(flags));
        }
        let name_len = usize::from(r.u8()?);
        let name = core::str::from_utf8(r.take(name_len)?).map_err(|_| DecodeError::NameNotUtf8)?;
        let name = SemaphoreName::new(name)?;
        let limit = r.u64()?;
        let generation = Generation(r.u64()?);
        let next_order_id = OrderId(r.u64()?);
        let data = r.bytes(DATA_BYTES_MAX)?;
        let owners_len = usize::from(r.u16()?);
        let waiters_len = usize::from(r.u16()?);
        if owners_len + waiters_len > PARTIES_MAX {
            return Err(DecodeError::TooLong);
        }
        let mut owners = Vec::with_capacity(owners_len);
        for _ in 0..owners_len {
            let (order_id, session, count, timeout_ms) = r.party()?;
            let request = read_request(&mut r)?;
            let token = Generation(r.u64()?);
            let data = r.bytes(PARTY_DATA_BYTES_MAX)?;
            owners.push(Owner {
                order_id,
                session,
                request,
                count,
                data,
                timeout_ms,
                token,
            });
        }
        let mut waiters = Vec::with_capacity(waiters_len);
        for _ in 0..waiters_len {
            let (order_id, session, count, timeout_ms) = r.party()?;
            let request = read_request(&mut r)?;
            let data = r.bytes(PARTY_DATA_BYTES_MAX)?;
            waiters.push(Waiter {
                order_id,
                session,
                request,
                count,
                data,
                timeout_ms,
            });
        }
        if !r.bytes.is_empty() {
            return Err(DecodeError::Trailing(r.bytes.len()));
        }
        let semaphore = Semaphore {
            name,
            limit,
            data,
            ephemeral: flags & EPHEMERAL != 0,
            deleting: flags & DELETING != 0,
            owners,
            waiters,
            next_order_id,
            generation,
        };
        semaphore.check_invariants()?;
        Ok(semaphore)
    }
}

fn put_party(
    out: &mut Vec<u8>,
    order_id: OrderId,
    session: SessionKey,
    count: u64,
    timeout_ms: u64,
) {
    for n in [
        order_id.0,
        session.incarnation.0,
        session.id.0,
        count,
        timeout_ms,
    ] {
        out.extend_from_slice(&n.to_le_bytes());
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// The bytes not read yet.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.bytes.len() {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut array = [0; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Length-prefixed bytes of at most `max`.
    fn bytes(&mut self, max: usize) -> Result<Vec<u8>, DecodeError> {
        let len = usize::from(self.u16()?);
        if len > max {
            return Err(DecodeError::TooLong);
        }
        Ok(self.take(len)?.to_vec())
    }

    fn party(&mut self) -> Result<(OrderId, SessionKey, u64, u64), DecodeError> {
        let order_id = OrderId(self.u64()?);
        let incarnation = Incarnation(self.u64()?);
        let id = SessionId(self.u64()?);
        let count = self.u64()?;
        let timeout_ms = self.u64()?;
        Ok((order_id, SessionKey { incarnation, id }, count, timeout_ms))
    }
}
