//! The timing rules every renewed lease follows — a slot's leadership and a session alike — kept
//! in one place so that the two machines cannot drift apart.
//!
//! A lease is renewed `L/4` after the send time of its last confirmed write; a confirmed write
//! sets the kill deadline to its send time + `0.8·L`; the guard before each renewal may only
//! lower that deadline; a failed attempt is retried only while the retry's answer could still
//! arrive before the deadline.

use crate::config::LeaseConfig;
use crate::time::Instant;

impl LeaseConfig {
    /// The kill deadline a write sent at `sent_at` earns once it is confirmed.
    #[inline]
    pub(crate) const fn deadline_after(&self, sent_at: Instant) -> Instant {
        sent_at.saturating_add_nanos(self.kill_ns())
    }

    /// When to renew after a confirmed write sent at `sent_at`.
    #[inline]
    pub(crate) const fn renew_at(&self, sent_at: Instant) -> Instant {
        sent_at.saturating_add_nanos(self.renew_ns())
    }

    /// The pre-renewal guard at `now`: the lowered deadline if `now + 0.75·L` comes before
    /// `deadline`, `None` when the deadline stays. Never a later deadline: an attempt that is
    /// not confirmed yet must not extend anything.
    #[inline]
    pub(crate) fn guarded(&self, now: Instant, deadline: Instant) -> Option<Instant> {
        let guard = now.saturating_add_nanos(self.guard_ns());
        (guard < deadline).then_some(guard)
    }

    /// When to retry after `failures` failed attempts in a row (at least one), or `None` when
    /// no retry can be answered (within the store-call timeout) before `deadline` any more.
    #[inline]
    pub(crate) fn retry_at(
        &self,
        failures: u8,
        now: Instant,
        deadline: Instant,
    ) -> Option<Instant> {
        let at = now + self.retry_backoff(failures);
        (at + self.store_timeout() < deadline).then_some(at)
    }
}
