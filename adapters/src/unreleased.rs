//! What a store handle remembers of semaphore parties found gone without a release of their
//! own (a session removed from outside): when it first saw each so, and the TTLs of the
//! sessions it made. The rule itself is the core's
//! ([`unreleased_party_left`](vvm_core::semaphore::unreleased_party_left)); the etcd and SQLite
//! stores share this memory of it.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use vvm_core::semaphore::{unreleased_party_left, SessionKey};

/// Most sessions remembered, in each of the two maps. Beyond it the oldest first sight is
/// forgotten: that party is then waited for a TTL again from its next sight (later, never
/// sooner).
const SESSIONS_MAX: usize = 4_096;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Unreleased {
    /// Parties found gone without a release, and when this handle first saw each so.
    gone_since: Mutex<HashMap<SessionKey, Instant>>,
    /// The TTL of each session this handle created or kept alive.
    ttls: Mutex<HashMap<SessionKey, Duration>>,
}

impl Unreleased {
    /// `party` was found gone without a release, and its session's TTL is `ttl`: how much
    /// longer it counts as a party (`None`: end it as expired). The first call for a party
    /// notes when it was first seen so, and logs it.
    pub(crate) fn left(&self, party: SessionKey, ttl: Duration) -> Option<Duration> {
        let now = Instant::now();
        let mut gone = self
            .gone_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !gone.contains_key(&party) && gone.len() >= SESSIONS_MAX {
            let oldest = gone.iter().min_by_key(|(_, at)| **at).map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                gone.remove(&oldest);
            }
        }
        let since = *gone.entry(party).or_insert_with(|| {
            tracing::warn!(session = %party, ttl_ms = ttl.as_millis(), "a semaphore party's session was removed from outside without a release: its units count as used for a session TTL");
            now
        });
        let left = unreleased_party_left(now.saturating_duration_since(since), ttl);
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

    /// This handle created or kept alive `session` with `ttl`.
    pub(crate) fn own_ttl(&self, session: SessionKey, ttl: Duration) {
        let mut ttls = self.ttls.lock().unwrap_or_else(PoisonError::into_inner);
        if ttls.len() < SESSIONS_MAX || ttls.contains_key(&session) {
            ttls.insert(session, ttl);
        }
    }

    /// The TTL this handle gave `session`, if it made it.
    pub(crate) fn ttl_of(&self, session: SessionKey) -> Option<Duration> {
        self.ttls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&session)
            .copied()
    }

    /// `session` is over (deleted by this handle): its TTL is forgotten.
    pub(crate) fn forget(&self, session: SessionKey) {
        self.ttls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&session);
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
        let first = unreleased.left(key(1), ttl).expect("counted");
        assert!(first <= ttl);
        std::thread::sleep(Duration::from_millis(20));
        let later = unreleased.left(key(1), ttl).expect("still counted");
        assert!(later <= ttl - Duration::from_millis(20), "{later:?}");
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(unreleased.left(key(1), ttl), None, "its session ran out");
        // Seen gone, then live: counted again from a new first sight.
        unreleased.left(key(2), ttl);
        std::thread::sleep(Duration::from_millis(45));
        unreleased.live(key(2));
        assert!(unreleased.left(key(2), ttl).is_some());
        unreleased.own_ttl(key(3), ttl);
        assert_eq!(unreleased.ttl_of(key(3)), Some(ttl));
        unreleased.forget(key(3));
        assert_eq!(unreleased.ttl_of(key(3)), None);
    }
}
