//! A party that ended without releasing its units: how long they still count as used.
//!
//! A store ends a party that it finds dead (its session expired, or its process gone) at once:
//! that session can act no more. A party whose session was *removed from outside* — a session
//! lease revoked or its keys deleted on etcd, a session row deleted in the SQLite file: the
//! usual ways to "unstick" a lock by hand — is another matter. Its holder did not release its
//! units and may still believe its session live until that session would have run out: its
//! command may still act. So its units count as used (it stays in the queue, in its place)
//! until a session TTL after the first moment a store handle saw it gone (its last sign of
//! life came before), and only then is it ended as by its expiry. A party that released its
//! units itself is no longer a party: nothing of this applies to it.

use core::time::Duration;

/// How much longer a party first seen gone `gone_for` ago, whose session's TTL is `ttl`, still
/// counts as a party: `None` once its session would have run out (end it as expired).
///
/// The holder's last renewal came before its removal, which came before it was first seen
/// gone, so its session runs out at the latest a TTL after that first sight.
#[must_use]
pub fn unreleased_party_left(gone_for: Duration, ttl: Duration) -> Option<Duration> {
    ttl.checked_sub(gone_for).filter(|left| !left.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_party_counts_until_a_ttl_after_it_was_first_seen_gone() {
        let ttl = Duration::from_secs(4);
        assert_eq!(unreleased_party_left(Duration::ZERO, ttl), Some(ttl));
        assert_eq!(
            unreleased_party_left(Duration::from_secs(1), ttl),
            Some(Duration::from_secs(3))
        );
        assert_eq!(unreleased_party_left(ttl, ttl), None);
        assert_eq!(unreleased_party_left(Duration::from_secs(9), ttl), None);
    }
}
