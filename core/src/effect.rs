//! What the machines ask the runtime to do: a closed set of [`Effect`]s written into a
//! fixed-capacity [`Effects`] buffer, so that handling an event never allocates.

use core::time::Duration;

use crate::time::Instant;

/// A slot number, `1..=N`. It is also the key of the slot's lease in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(pub u32);

/// The revision a store assigned to a write. Strictly increases per key, across holders and
/// across delete and re-insert.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Revision(pub u64);

/// Identifies one process start. Random per start, so that a restarted process never mistakes
/// its predecessor's lease for its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Incarnation(pub u64);

/// The fencing token: `(slot, revision)` of the write that confirmed a holding, strictly
/// increasing per slot across holders. Services pass it along with their own writes so that a
/// stale leader's writes can be refused. A semaphore grant's token is one too, on slot 0, its
/// revision the semaphore's count of grants (`1` for the first grant, then one more per grant).
///
/// It has one printed form, `<slot>:<revision>` (e.g. `1:4294967297`): [`Display`] writes it,
/// [`FromStr`] reads it back, and the host gives it to its command as `VVM_FENCING_TOKEN`.
///
/// The numbers are the store's own, and only their order within one slot means anything:
/// SQLite counts the writes of the whole file on one counter that jumps by 2^32 at the first
/// open after each boot (so a power loss cannot hand out a revision twice: the first boot's
/// first write is `4294967297`); etcd gives the cluster's revision of the write (shared by
/// every key, so it starts low and rises by more than one); the memory store counts every
/// write; FoundationDB and PostgreSQL count the writes of each slot's record. Tokens of
/// different slots, stores or semaphores are not comparable.
///
/// [`Display`]: core::fmt::Display
/// [`FromStr`]: core::str::FromStr
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken {
    /// The slot held (0 for a semaphore grant).
    pub slot: Slot,
    /// The store revision of the write that confirmed the holding.
    pub revision: Revision,
}

impl core::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}:{}", self.slot.0, self.revision.0)
    }
}

/// Text that is not a fencing token's printed form `<slot>:<revision>`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a fencing token: expected <slot>:<revision>, two decimal numbers")]
pub struct FencingTokenError {
    /// The text refused.
    pub text: String,
}

impl core::str::FromStr for FencingToken {
    type Err = FencingTokenError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let refused = || FencingTokenError {
            text: text.to_owned(),
        };
        let (slot, revision) = text.split_once(':').ok_or_else(refused)?;
        Ok(FencingToken {
            slot: Slot(decimal(slot).ok_or_else(refused)?),
            revision: Revision(decimal(revision).ok_or_else(refused)?),
        })
    }
}

/// `part` as a number, if it is written as `Display` writes one: `u64::from_str` takes a
/// leading `+` and zeros, and one token must have one printed form.
fn decimal<T: core::str::FromStr>(part: &str) -> Option<T> {
    let digits = !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    if !digits || (part.len() > 1 && part.starts_with('0')) {
        return None;
    }
    part.parse().ok()
}

/// Names one store operation. A reply carrying an `OpId` that the machine no longer waits for
/// is stale and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// What a timer is for. The runtime keeps at most one pending timer per kind; a newer
/// [`Effect::SetTimer`] of the same kind replaces the older one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimerKind {
    /// Leadership or a session: the next renewal (keepalive), or the next retry of a failed one.
    Lease,
    /// Lifecycle: the next acquisition round.
    Round,
}

/// Names one armed timer. A firing whose id the machine no longer waits for is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimerId {
    /// What it is for.
    pub kind: TimerKind,
    /// Distinguishes successive timers of one kind.
    pub seq: u64,
}

/// Why leadership of a slot ended without a release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossReason {
    /// The store refused the renewal: the record changed, expired or was deleted.
    Overtaken,
    /// Renewals kept failing until no answer could arrive before the kill deadline any more.
    RenewalFailed,
    /// A renewal was confirmed only after the deadline it would set had passed (the process
    /// was paused): the lease may still be ours in the store, but must not be acted on.
    DeadlinePassed,
    /// The process gave a session up without closing it: services under one of its holdings
    /// stopped without being vouched for (aborted, vanished), so the session sends no keepalive
    /// any more and its kill deadline stays where it was. Reported by the runtime only (no core
    /// machine decides it) to every holding of that session.
    Abandoned,
    /// The store's sign of the session's liveness was lost while the process lived (PostgreSQL:
    /// the connection holding its advisory lock broke): others may judge the session ended
    /// from then on, before its TTL, so the kill deadline moves to now. Reported by the
    /// runtime only (no core machine decides it).
    MarkLost,
}

/// Why a slot was not acquired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Another live record holds the slot.
    Held,
    /// The store failed, or the outcome stayed unknown after reading it back.
    StoreFailed,
    /// The insert was confirmed only after the deadline it would set had passed (the process
    /// was paused); the record is left to expire.
    DeadlinePassed,
}

/// The first thing that went wrong in a VVM. Write-once: later problems are dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Problem {
    /// No slot was won within the acquisition duration.
    AcquisitionFailed,
    /// Service number `index` (in start order) failed to start.
    ServiceStartFailed {
        /// Position in the start order.
        index: u16,
    },
    /// Leadership of `slot` was lost.
    LeadershipLost {
        /// The slot that was held.
        slot: Slot,
        /// Why it was lost.
        reason: LossReason,
    },
    /// Service number `index` failed while running.
    ServiceFailed {
        /// Position in the start order.
        index: u16,
    },
    /// The services ended without being asked to and without a report of which one failed (the
    /// task running them vanished, e.g. it panicked).
    ServicesVanished,
}

/// An instruction from a machine to the runtime. Store operations always concern this VVM's own
/// record value (address and incarnation), which the runtime knows; they never carry it, so that
/// effects stay `Copy` and handling an event never allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effect {
    /// Write our record under `slot` with time-to-live `ttl`, only if no live record exists.
    /// From a [`SessionLeadership`](crate::SessionLeadership): the session's acquire of the slot
    /// (`ttl` zero: the holding lives as long as the session).
    /// Replied to with [`Reply::Written`], or with [`Reply::Held`] (or [`Reply::Rejected`] when
    /// the store cannot tell how long the live record has left).
    Insert {
        /// Names the reply.
        op: OpId,
        /// The key.
        slot: Slot,
        /// Time to live of the record.
        ttl: Duration,
    },
    /// Rewrite our record, only if the live record is ours at revision `expected`; extends its
    /// life to `ttl`. Replied to with [`Reply::Written`] or [`Reply::Rejected`].
    CompareAndSwap {
        /// Names the reply.
        op: OpId,
        /// The key.
        slot: Slot,
        /// The revision our last confirmed write produced.
        expected: Revision,
        /// New time to live.
        ttl: Duration,
    },
    /// Delete the record, only if it is ours at revision `expected`. Never deletes a record
    /// written by someone else. Replied to with [`Reply::Deleted`] or [`Reply::Rejected`].
    CompareAndDelete {
        /// Names the reply.
        op: OpId,
        /// The key.
        slot: Slot,
        /// The revision our last confirmed write produced.
        expected: Revision,
    },
    /// Read the live record; used to resolve an operation whose outcome is unknown.
    /// Replied to with [`Reply::Found`].
    Get {
        /// Names the reply.
        op: OpId,
        /// The key.
        slot: Slot,
    },
    /// Fire [`TimerId`] at `at`, replacing any pending timer of the same kind.
    SetTimer {
        /// Names the firing.
        timer: TimerId,
        /// When.
        at: Instant,
    },
    /// Set this VVM's kill deadline to `at`: from then on the process must not act as leader,
    /// so the killer ends it. Removed only by [`Effect::DisarmKiller`].
    ArmKiller {
        /// The deadline.
        at: Instant,
    },
    /// Remove this VVM's kill deadline: every service stopped by itself and the release of the
    /// record was confirmed, so nothing of this VVM acts any more. Emitted at most once, just
    /// before [`Effect::Finished`], and never after a loss. For a VVM on a session (whose
    /// deadline is the session's) it says that every service stopped by itself and nothing was
    /// lost: the session may be closed cleanly, which disarms once its delete is confirmed.
    DisarmKiller,
    /// Leadership of a slot was won.
    Acquired {
        /// The first token of this tenure.
        token: FencingToken,
    },
    /// A renewal was confirmed; the token is the new revision.
    Renewed {
        /// The new token.
        token: FencingToken,
    },
    /// An acquisition attempt did not win the slot.
    NotAcquired {
        /// The slot tried.
        slot: Slot,
        /// Why.
        refusal: Refusal,
    },
    /// Leadership of a slot ended without a release.
    Lost {
        /// The slot.
        slot: Slot,
        /// Why.
        reason: LossReason,
    },
    /// The leadership machine is done: nothing in flight, our record deleted if we held one.
    Released {
        /// The slot, if one was held or tried.
        slot: Option<Slot>,
        /// Whether a record of ours was actually deleted.
        deleted: bool,
    },
    /// Start the services in declaration order and report [`crate::VvmEvent::ServicesStarted`]
    /// or [`crate::VvmEvent::ServiceFailed`].
    StartServices {
        /// Token the services guard their writes with.
        token: FencingToken,
    },
    /// Stop the services in reverse order, wait for each, then report
    /// [`crate::VvmEvent::ServicesStopped`]. Emitted on shutdown and on a loss of leadership.
    StopServices,
    /// Launch is complete: leadership is held and services are up.
    Running {
        /// The token of the tenure.
        token: FencingToken,
    },
    /// The first problem of this VVM. Emitted once.
    ProblemRaised {
        /// What went wrong.
        problem: Problem,
    },
    /// Renewals have stopped; nothing will be written any more except the release.
    MonitorStopped,
    /// The VVM's own session was lost while it campaigned, holding nothing (only from a
    /// [`Lifecycle::on_own_session`](crate::Lifecycle::on_own_session)): open a fresh session
    /// — the acquisition rides out what a candidate on a per-slot lease rides out — and report
    /// [`VvmEvent::SessionOpened`](crate::VvmEvent::SessionOpened), or
    /// [`VvmEvent::SessionLost`](crate::VvmEvent::SessionLost) when none opened before the
    /// acquisition's end.
    OpenSession {
        /// The end of the acquisition: no session is worth opening after it.
        until: Instant,
    },
    /// Shutdown is complete. Carries the problem to return, if any.
    Finished {
        /// The first problem, if any.
        problem: Option<Problem>,
    },
}

/// The reply to a store [`Effect`], as the runtime observed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// Insert or compare-and-swap wrote; the store assigned `Revision`.
    Written(Revision),
    /// The condition did not hold; nothing was written.
    Rejected,
    /// An insert found a live record, which has this long left on the store's own clock; nothing
    /// was written. Only a hint of when to try again: the store still judges every insert.
    Held(Duration),
    /// Compare-and-delete deleted our record.
    Deleted,
    /// `Get` found this live record, or none.
    Found(Option<Record>),
    /// The call failed and nothing was written.
    Failed,
    /// The call timed out or its outcome is otherwise unknown: it may have committed.
    Unknown,
}

/// A live record as seen by `Get`, reduced to what the core compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    /// Incarnation of the process that wrote it. The runtime reports a record whose address
    /// is not ours with that record's incarnation, never with ours.
    pub incarnation: Incarnation,
    /// Its revision.
    pub revision: Revision,
}

/// Most effects one event can produce (the lifecycle forwarding to leadership included).
pub const EFFECTS_MAX: usize = 8;

/// Defines a fixed-capacity, allocation-free buffer of effects: `$name` holds at most `$cap`
/// values of `$item` (a `Copy` type); `$filler` fills the unused places. One definition for
/// every machine's effect buffer, so that each machine keeps its own closed effect enum.
macro_rules! effect_buffer {
    ($(#[$meta:meta])* $name:ident, $item:ty, $cap:ident, $filler:expr) => {
        $(#[$meta])*
        #[derive(Clone, Debug)]
        pub struct $name {
            items: [$item; $cap],
            len: usize,
        }

        impl $name {
            /// An empty buffer.
            pub const fn new() -> Self {
                $name {
                    items: [$filler; $cap],
                    len: 0,
                }
            }

            /// Appends an effect.
            ///
            /// # Panics
            #[doc = concat!("When more than [`", stringify!($cap), "`] effects are pushed between")]
            /// two [`clear`](Self::clear)s, which no transition of the machines does (proptest
            /// checks it).
            #[inline]
            pub fn push(&mut self, effect: $item) {
                assert!(self.len < $cap, "effects capacity exceeded");
                self.items[self.len] = effect;
                self.len += 1;
            }

            /// The effects pushed so far, in order.
            #[inline]
            pub fn as_slice(&self) -> &[$item] {
                &self.items[..self.len]
            }

            /// Removes every effect.
            #[inline]
            pub fn clear(&mut self) {
                self.len = 0;
            }

            /// Number of effects.
            #[inline]
            pub const fn len(&self) -> usize {
                self.len
            }

            /// Whether there are none.
            #[inline]
            pub const fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// Iterates over the effects in order.
            #[inline]
            pub fn iter(&self) -> core::slice::Iter<'_, $item> {
                self.as_slice().iter()
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::new()
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                self.as_slice() == other.as_slice()
            }
        }

        impl Eq for $name {}

        impl<'a> IntoIterator for &'a $name {
            type Item = &'a $item;
            type IntoIter = core::slice::Iter<'a, $item>;

            fn into_iter(self) -> Self::IntoIter {
                self.iter()
            }
        }
    };
}
pub(crate) use effect_buffer;

effect_buffer!(
    /// A fixed-capacity, allocation-free list of effects, filled by `handle` and drained by the
    /// runtime. Capacity is [`EFFECTS_MAX`]; overflowing it is a bug in a machine, not an input
    /// error.
    Effects,
    Effect,
    EFFECTS_MAX,
    Effect::StopServices
);

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Lease.TokenForm
    #[test]
    fn a_fencing_token_prints_as_slot_colon_revision_and_reads_back() {
        let token = FencingToken {
            slot: Slot(1),
            revision: Revision(4_294_967_297),
        };
        assert_eq!(token.to_string(), "1:4294967297");
        assert_eq!("1:4294967297".parse(), Ok(token));
        let grant = FencingToken {
            slot: Slot(0),
            revision: Revision(u64::MAX),
        };
        assert_eq!(grant.to_string().parse(), Ok(grant));
    }

    // covers: Lease.TokenForm
    #[test]
    fn only_the_printed_form_reads_as_a_fencing_token() {
        for text in [
            "",
            "1",
            "1:",
            ":2",
            "1/2",
            "1:2:3",
            "+1:2",
            "1:+2",
            "01:2",
            "1:02",
            " 1:2",
            "1:2 ",
            "1:-2",
            "4294967296:1",
            "1:18446744073709551616",
        ] {
            assert_eq!(
                text.parse::<FencingToken>(),
                Err(FencingTokenError {
                    text: text.to_owned()
                }),
                "{text:?}"
            );
        }
    }
}
