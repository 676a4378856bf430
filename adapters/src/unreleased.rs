//! What a store handle remembers of semaphore owners found gone without a release of their
//! own (a session removed from outside): when it first saw each so, and the TTL it knew then. The rule itself is the core's
//! ([`unreleased_party_left`](vvm_core::semaphore::unreleased_party_left)); the etcd, SQLite and
//! transactional stores share this memory of it, each on its own clock (the time it judges
//! sessions by: the boot clock for SQLite, the runtime's for etcd, the store's time source for
//! the transactional stores).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use vvm_core::semaphore::{unreleased_party_left, SessionKey};
use vvm_core::Instant;

/// Most sessions remembered. Beyond it the oldest first sight is
/// forgotten: that party is then waited for a TTL again from its next sight (later, never
/// sooner).
const SESSIONS_MAX: usize = 4_096;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Unreleased {
    /// Parties found gone without a release: when this handle first saw each so, and the TTL
    /// it knew for it then.
    gone_since: Mutex<HashMap<SessionKey, (Instant, Duration)>>,
}

impl Unreleased {
    /// `party` was found gone without a release at `now`, and its session's TTL is `ttl`: how
    /// much longer it counts as a party (`None`: end it as expired). The first call for a party
    /// notes when it was first seen so and that TTL (the best known: a store may know the
    /// party's own only until it is gone), and logs it.
    pub(crate) fn left(&self, party: SessionKey, ttl: Duration, now: Instant) -> Option<Duration> {
        let mut gone = self
            .gone_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !gone.contains_key(&party) && gone.len() >= SESSIONS_MAX {
            let oldest = gone.iter().min_by_key(|(_, at)| at.0).map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                gone.remove(&oldest);
            }
        }
        let (since, ttl) = *gone.entry(party).or_insert_with(|| {
            tracing::warn!(session = %party, ttl_ms = ttl.as_millis(), "a semaphore owner's session was removed from outside without a release: its units count as used for a session TTL");
            (now, ttl)
        });
        let left = unreleased_party_left(now.saturating_since(since), ttl);
        if left.is_none() {
            gone.remove(&party);
        }
        left
    }

    /// `party` was found live: an earlier sight of it gone (a read that raced its creation)
    /// tells nothing any more.
    pub(crate) fn live(&self, party: SessionKey) {
        let mut gone = self
            .gone_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !gone.is_empty() {
            gone.remove(&party);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vvm_core::{Incarnation, SessionId};

    fn key(n: u64) -> SessionKey {
        SessionKey {
            incarnation: Incarnation(n),
            id: SessionId(1),
        }
    }

    #[test]
    fn a_gone_party_counts_from_its_first_sight_and_a_live_one_is_forgotten() {
        let unreleased = Unreleased::default();
        let ttl = Duration::from_millis(40);
        let at = |ms: u64| Instant::from_nanos(1_000_000_000 + ms * 1_000_000);
        assert_eq!(unreleased.left(key(1), ttl, at(0)), Some(ttl));
        assert_eq!(
            unreleased.left(key(1), ttl, at(30)),
            Some(Duration::from_millis(10)),
            "counted from the first sight"
        );
        assert_eq!(
            unreleased.left(key(1), ttl, at(40)),
            None,
            "its session ran out"
        );
        // Seen gone, then live: counted again from a new first sight.
        unreleased.left(key(2), ttl, at(0));
        unreleased.live(key(2));
        assert_eq!(unreleased.left(key(2), ttl, at(45)), Some(ttl));
    }
}
