//! A slot's record removed from outside (`etcdctl del`, `etcdctl lease revoke`): a waiting
//! candidate must not lead before that record's holder has stopped acting.
//!
//! etcd deletes a key alike for a release, an expiry, a `del` and a lease revocation. A holder
//! that did not release its record learns of the removal only at its next renewal (its
//! compare-and-swap finds nothing: a loss) and may act until its kill deadline, which comes
//! before its last renewal's lease would have run out. So a candidate tells the holder's own
//! release from every other end, and after any other end waits until that lease would have
//! run out — which an expiry has already reached, so failover after a holder's death is not
//! slowed.
//!
//! # The slot's state key
//!
//! Beside each slot key, `<prefix>\0slot/<slot>` (no lease, so that neither an expiry nor a
//! revocation removes it; `\0` keeps it out of every range of slot keys) holds:
//! - `held <ttl in ms>`, written by the insert that took the slot (in its transaction);
//! - `released <revision, 20 digits>`, written by the holder's own release (in the delete's
//!   transaction), naming the `mod_revision` of the record it released. The digits are
//!   zero-padded so that etcd's byte-wise comparison of values orders them as numbers;
//! - `holding <session record key>`, written by a session's acquire (`Et.HoldingRemoved`): while
//!   that record lives, a slot found free had its holding removed from outside and is waited for;
//!   once it is gone the session ended, with its holdings.
//!
//! # What a candidate remembers
//!
//! Per slot key, this store handle notes the highest `mod_revision` of a write it saw on the
//! key (in an answer of an insert, or on its change feed, which sees every renewal) and the
//! local time it first saw it: that write, and so its lease, began before. When the feed then
//! reports the key's deletion right after that write (its previous value has that revision),
//! the record's lease would have run out by that time plus the holder's TTL (read from the
//! state key), and by the end its time left said when asked for that write (rounded up; this
//! matters for a record first seen long after its last renewal, as by a `vvm run` restarted
//! after a crash): the candidate waits until then unless the state key says the record was
//! released. A deletion it did not see (the key found absent), or one that followed a write it
//! missed, counts from the moment it learnt of it.
//!
//! A candidate that never saw the record (started after it was removed) finds the state key
//! saying `held`: it waits the holder's TTL from that first sight. A state key removed too
//! (`etcdctl del --prefix`) tells such a newcomer nothing: it inserts at once.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use vvm_core::Slot;

/// Most slot keys remembered per store handle; beyond it a key is not remembered (its
/// candidate then judges as one that never saw the record).
const KEYS_MAX: usize = 4_096;

/// The part of a state key between the prefix and the slot number.
const STATE_PART: &str = "\0slot/";
/// The value of a state key while an insert's record may live.
const HELD: &str = "held ";
/// The value of a state key after a holder's own release, before the revision.
const RELEASED: &str = "released ";
/// The value of a state key while a session's holding may live on the slot, before that
/// session's record key (`Et.HoldingRemoved`, written by the session's acquire).
pub(super) const HOLDING: &str = "holding ";

/// The state key of `slot` under `prefix`.
pub(super) fn state_key(prefix: &str, slot: Slot) -> Vec<u8> {
    format!("{prefix}{STATE_PART}{}", slot.0).into_bytes()
}

/// The state written by an insert whose record has `ttl`.
pub(super) fn held(ttl: Duration) -> Vec<u8> {
    format!("{HELD}{}", ttl.as_millis()).into_bytes()
}

/// The state written by the release of the record at `revision`.
pub(super) fn released(revision: i64) -> Vec<u8> {
    format!("{RELEASED}{revision:020}").into_bytes()
}

/// The smallest value above every `released` state of a revision below `revision`: a state
/// compared greater names a release of the record at `revision` or of a later one. The empty
/// revision (no record seen) lets every release pass.
pub(super) fn released_since(revision: Option<i64>) -> Vec<u8> {
    match revision {
        Some(revision) if revision > 0 => released(revision - 1),
        _ => RELEASED.as_bytes().to_vec(),
    }
}

/// A state key's value, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// No state key: the slot was never taken by an insert of this kind, or the key was
    /// removed from outside.
    Absent,
    /// Taken by an insert whose record has this TTL (`None`: unreadable).
    Held(Option<Duration>),
    /// Released by its holder, the record's revision then.
    Released(i64),
}

impl State {
    /// The state in `value` (a key's bytes, or `None` for no key). A value this module did not
    /// write is read as held with an unknown TTL: it proves no release.
    pub(super) fn read(value: Option<&[u8]>) -> State {
        let Some(value) = value else {
            return State::Absent;
        };
        let text = std::str::from_utf8(value).unwrap_or("");
        if let Some(revision) = text.strip_prefix(RELEASED) {
            if let Ok(revision) = revision.parse() {
                return State::Released(revision);
            }
        }
        let ttl = text
            .strip_prefix(HELD)
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis);
        State::Held(ttl)
    }
}

/// What a store handle saw of one slot key.
#[derive(Debug)]
struct Seen {
    /// The highest `mod_revision` of a write seen on the key.
    revision: i64,
    /// When that write (or, see [`Vanished::deleted`], the deletion after a missed one) was
    /// first seen.
    at: Instant,
    /// The feed reported the key's deletion right after that write.
    deleted: bool,
    /// That write was this handle's own: it saw every renewal after it too.
    own: bool,
    /// The record's holder's TTL, as its state key said.
    ttl: Option<Duration>,
    /// When the key was first found absent without a release since that write.
    gone_since: Option<Instant>,
    /// When that write's lease ends at the latest, as its time left said.
    ends: Option<Instant>,
}

/// What the candidates of one store handle (and its clones) saw of their slots' records.
#[derive(Debug, Default)]
pub(super) struct Vanished {
    seen: Mutex<HashMap<Vec<u8>, Seen>>,
    /// First sights of vanished records by candidates that saw no record there.
    unseen_gone: Mutex<HashMap<Vec<u8>, Instant>>,
}

/// How a candidate stands with a slot whose key is absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It may insert.
    Free,
    /// It waits this long yet; `first` on the first look that found it so.
    Wait { left: Duration, first: bool },
}

impl Vanished {
    /// A write with `revision` on `key` was seen now (an answer, or the feed).
    pub(super) fn put(&self, key: &[u8], revision: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = seen.get_mut(key) {
            if revision > entry.revision {
                *entry = Seen {
                    revision,
                    at: Instant::now(),
                    deleted: false,
                    own: false,
                    ttl: entry.ttl,
                    gone_since: None,
                    ends: None,
                };
            }
            return;
        }
        if seen.len() < KEYS_MAX {
            let entry = Seen {
                revision,
                at: Instant::now(),
                deleted: false,
                own: false,
                ttl: None,
                gone_since: None,
                ends: None,
            };
            seen.insert(key.to_vec(), entry);
        }
    }

    /// The highest revision of a write seen on `key`, if any.
    pub(super) fn revision(&self, key: &[u8]) -> Option<i64> {
        let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(key).map(|entry| entry.revision)
    }

    /// The lease of the write at `revision` on `key` ends by `ends` (its time left, asked).
    pub(super) fn lease_ends(&self, key: &[u8], revision: i64, ends: Instant) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = seen.get_mut(key).filter(|entry| entry.revision == revision) {
            entry.ends = Some(entry.ends.map_or(ends, |known| known.min(ends)));
        }
    }

    /// The state key of a live record on `key` says its holder's TTL is `ttl`.
    pub(super) fn holder_ttl(&self, key: &[u8], ttl: Duration) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = seen.get_mut(key) {
            entry.ttl = Some(ttl);
        }
    }

    /// The feed saw `key` deleted at `revision`, after the write at `previous` (`None`: its
    /// previous value was compacted away).
    pub(super) fn deleted(&self, key: &[u8], revision: i64, previous: Option<i64>) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = seen.get_mut(key) else {
            return;
        };
        if revision <= entry.revision || entry.deleted {
            return; // an older deletion, replayed
        }
        if previous != Some(entry.revision) {
            // It followed a write this handle did not see, which began before now.
            entry.revision = previous.unwrap_or(entry.revision);
            entry.at = Instant::now();
            entry.ends = None;
        }
        entry.deleted = true;
    }

    /// `key` is absent and its state key says `state`, written at `state_revision` (the
    /// insert that began the last tenure, for `held`): whether a candidate whose own TTL is
    /// `own_ttl` may insert now. The holder's TTL is the state key's, else the one it said
    /// while the record lived, else `own_ttl`.
    pub(super) fn verdict(
        &self,
        key: &[u8],
        state: State,
        state_revision: Option<i64>,
        own_ttl: Duration,
    ) -> Verdict {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = seen.get_mut(key) {
            if matches!(state, State::Released(revision) if revision >= entry.revision) {
                seen.remove(key);
                return Verdict::Free;
            }
            let ttl = match state {
                State::Held(Some(ttl)) => ttl,
                _ => entry.ttl.unwrap_or(own_ttl),
            };
            let first = entry.gone_since.is_none();
            let gone_since = *entry.gone_since.get_or_insert(now);
            // This handle's own record, and no tenure begun since: it wrote the last renewal.
            let last_is_own =
                entry.own && state_revision.is_none_or(|begun| begun <= entry.revision);
            let until = if entry.deleted || last_is_own {
                // That write's lease ends by its sight plus the TTL, and by what its time
                // left said (a record first seen long after its last renewal).
                let until = entry.at + ttl;
                entry.ends.map_or(until, |ends| ends.min(until))
            } else {
                gone_since + ttl
            };
            return match until.checked_duration_since(now) {
                Some(left) if !left.is_zero() => Verdict::Wait { left, first },
                _ => {
                    seen.remove(key);
                    Verdict::Free
                }
            };
        }
        drop(seen);
        let State::Held(ttl) = state else {
            return Verdict::Free;
        };
        let ttl = ttl.unwrap_or(own_ttl);
        let mut unseen = self
            .unseen_gone
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !unseen.contains_key(key) && unseen.len() >= KEYS_MAX {
            // Nothing left to remember by: wait as if first seen now, every time.
            return Verdict::Wait {
                left: ttl,
                first: true,
            };
        }
        let first = !unseen.contains_key(key);
        let since = *unseen.entry(key.to_vec()).or_insert(now);
        match (since + ttl).checked_duration_since(now) {
            Some(left) if !left.is_zero() => Verdict::Wait { left, first },
            _ => {
                unseen.remove(key);
                Verdict::Free
            }
        }
    }

    /// This handle wrote a record on `key` at `revision` with `ttl` (an insert or a renewal),
    /// answered now: that record's lease runs out by now plus `ttl`, and nothing of an earlier
    /// one is waited for.
    pub(super) fn wrote(&self, key: &[u8], revision: i64, ttl: Duration) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() < KEYS_MAX || seen.contains_key(key) {
            let entry = Seen {
                revision,
                at: Instant::now(),
                deleted: false,
                own: true,
                ttl: Some(ttl),
                gone_since: None,
                ends: None,
            };
            seen.insert(key.to_vec(), entry);
        }
        drop(seen);
        self.unseen_gone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"vvm/1";
    const TTL: Duration = Duration::from_secs(2);

    #[test]
    fn states_round_trip_and_released_ones_order_as_numbers() {
        assert_eq!(State::read(None), State::Absent);
        assert_eq!(State::read(Some(&held(TTL))), State::Held(Some(TTL)));
        assert_eq!(State::read(Some(&released(42))), State::Released(42));
        assert_eq!(State::read(Some(b"foreign")), State::Held(None));
        assert!(released(10) > released_since(Some(10)));
        assert!(released(9) <= released_since(Some(10)));
        assert!(released(1) > released_since(None));
        assert!(held(TTL) < released_since(None));
    }

    #[test]
    fn a_deletion_right_after_a_seen_write_counts_from_that_write() {
        let vanished = Vanished::default();
        vanished.put(KEY, 7);
        std::thread::sleep(Duration::from_millis(30));
        vanished.deleted(KEY, 8, Some(7));
        let Verdict::Wait { left, first } = vanished.verdict(KEY, State::Absent, None, TTL) else {
            panic!("a removed record is waited for");
        };
        assert!(first && left <= TTL - Duration::from_millis(30), "{left:?}");
        // Released by its holder: free at once.
        assert_eq!(
            vanished.verdict(KEY, State::Released(7), None, TTL),
            Verdict::Free
        );
    }

    #[test]
    fn a_time_left_shortens_the_wait_on_a_write_seen_late() {
        let vanished = Vanished::default();
        vanished.put(KEY, 7);
        vanished.lease_ends(KEY, 7, Instant::now() + Duration::from_millis(20));
        // Of another write: not this one's.
        vanished.lease_ends(KEY, 6, Instant::now());
        vanished.deleted(KEY, 8, Some(7));
        let Verdict::Wait { left, .. } = vanished.verdict(KEY, State::Absent, None, TTL) else {
            panic!("waited");
        };
        assert!(left <= Duration::from_millis(20), "{left:?}");
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(
            vanished.verdict(KEY, State::Absent, None, TTL),
            Verdict::Free
        );
        // A deletion not seen right after it: the time left tells nothing.
        vanished.put(KEY, 9);
        vanished.lease_ends(KEY, 9, Instant::now());
        assert!(matches!(
            vanished.verdict(KEY, State::Absent, None, TTL),
            Verdict::Wait { .. }
        ));
    }

    #[test]
    fn a_release_of_an_older_record_does_not_free_a_later_one() {
        let vanished = Vanished::default();
        vanished.put(KEY, 9);
        vanished.deleted(KEY, 10, Some(9));
        assert!(matches!(
            vanished.verdict(KEY, State::Released(5), None, TTL),
            Verdict::Wait { .. }
        ));
    }

    #[test]
    fn a_deletion_after_a_missed_write_or_none_seen_counts_from_now() {
        let vanished = Vanished::default();
        vanished.put(KEY, 3);
        std::thread::sleep(Duration::from_millis(50));
        vanished.deleted(KEY, 6, Some(5));
        let Verdict::Wait { left, .. } = vanished.verdict(KEY, State::Absent, None, TTL) else {
            panic!("waited");
        };
        assert!(left > TTL - Duration::from_millis(40), "{left:?}");
        let other = b"vvm/2";
        vanished.put(other, 3);
        let Verdict::Wait { left, first } = vanished.verdict(other, State::Absent, None, TTL)
        else {
            panic!("waited");
        };
        assert!(first && left > TTL - Duration::from_millis(40));
        let Verdict::Wait { first, .. } = vanished.verdict(other, State::Absent, None, TTL) else {
            panic!("waited");
        };
        assert!(!first, "first sight is kept");
        // The wait ends: a zero TTL has passed.
        assert_eq!(
            vanished.verdict(other, State::Held(Some(Duration::ZERO)), None, TTL),
            Verdict::Free
        );
    }

    #[test]
    fn a_newcomer_waits_only_on_a_held_state() {
        let vanished = Vanished::default();
        assert_eq!(
            vanished.verdict(KEY, State::Absent, None, TTL),
            Verdict::Free
        );
        assert_eq!(
            vanished.verdict(KEY, State::Released(3), None, TTL),
            Verdict::Free
        );
        let long = Duration::from_secs(9);
        let Verdict::Wait { left, first } =
            vanished.verdict(KEY, State::Held(Some(long)), None, TTL)
        else {
            panic!("waited");
        };
        assert!(
            first && left > TTL,
            "the holder's TTL, not its own: {left:?}"
        );
    }

    #[test]
    fn an_own_record_counts_from_its_last_write_unless_a_tenure_began_since() {
        let vanished = Vanished::default();
        let short = Duration::from_millis(30);
        vanished.wrote(KEY, 4, short);
        std::thread::sleep(Duration::from_millis(40));
        // Expired: its last renewal was this handle's, a lease ago.
        assert_eq!(
            vanished.verdict(KEY, State::Held(Some(short)), Some(4), TTL),
            Verdict::Free
        );
        vanished.wrote(KEY, 6, Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(40));
        // Another holder's insert came after (its state key is newer), its writes unseen.
        assert!(matches!(
            vanished.verdict(KEY, State::Held(Some(TTL)), Some(8), TTL),
            Verdict::Wait { .. }
        ));
    }
}
