//! # vvm-core: the machines that only compute
//!
//! State machines decide everything vvm does; none performs I/O, reads a clock, spawns a thread
//! or allocates while handling an event:
//!
//! - [`Leadership`]: leadership of one slot — insert, renew every `L/4`, retry, resolve unknown
//!   outcomes, release — and the kill deadline that keeps a stale leader from acting.
//! - [`SessionLeadership`]: leadership of one slot held as a holding of a session — acquired
//!   through the session, never renewed by itself, lost with the session, released by deleting
//!   the holding; no timer and no kill deadline of its own.
//! - [`Lifecycle`]: one VVM — acquisition over slots `1..=N`, services, the write-once problem
//!   and the fixed shutdown order. It embeds a [`Leadership`] or, for a VVM on a session
//!   ([`Lifecycle::on_session`]), a [`SessionLeadership`].
//! - [`Session`]: the unit of liveness of a process — one record, one keepalive and one kill
//!   deadline for every holding attached to it, lost all at once. It follows the same renewal
//!   rules as [`Leadership`] and writes its own closed set of [`SessionEffect`]s.
//! - [`Semaphore`]: one counted semaphore of the coordination service — owners, a FIFO queue of
//!   waiters, owners' data, tokens — as a pure function of its state and one operation, which
//!   every store runs inside one transaction; plus its byte form for key-value stores.
//!
//! ```text
//!            event (carries `now`)                effects (data)
//!  runtime ──────────────────────────▶ machine ─────────────────────▶ runtime
//!   ▲   Launch / Shutdown / Timer /    handle()   Insert / CompareAndSwap / Get /
//!   │   Reply{op} / Services*                     CompareAndDelete / SetTimer /
//!   │                                             ArmKiller / StartServices / ...
//!   └──────────── replies and timer firings come back as events ◀────────────┘
//! ```
//!
//! Every store effect carries an [`OpId`] and every timer a [`TimerId`]; a reply or firing the
//! machine no longer waits for is ignored, so the runtime never has to cancel anything.
//!
//! Retries are part of the machines, not of a retry crate: the pause before retrying a failed
//! renewal (`L/20`, `L/10`, then `L/5`) is a pure function of the lease and of the `now` carried
//! by events, without jitter, because the kill deadline is computed from the same values and the
//! model checks and simulations replay every schedule exactly. A crate like `backon` sleeps and
//! draws random jitter itself, which would put a clock and randomness inside the machine.
//!
//! ```
//! use core::time::Duration;
//! use vvm_core::*;
//!
//! let config = VvmConfig::builder("10.0.0.1:7000").build().unwrap();
//! let mut vvm = Lifecycle::new(&config, Incarnation(7));
//! let mut out = Effects::new();
//! vvm.handle(&VvmEvent::Launch { now: Instant::ZERO }, &mut out);
//! let Effect::Insert { op, slot, .. } = out.as_slice()[0] else { panic!() };
//! assert_eq!(slot, Slot(1));
//!
//! out.clear();
//! let reply = Reply::Written(Revision(1));
//! vvm.handle(&VvmEvent::Reply { now: Instant::ZERO, op, reply }, &mut out);
//! assert!(out.iter().any(|e| matches!(e, Effect::StartServices { .. })));
//! ```
#![forbid(unsafe_code)]
#![deny(missing_debug_implementations)]
#![deny(missing_docs)]

mod config;
mod effect;
pub mod holding;
pub mod leadership;
pub mod lifecycle;
mod renewal;
pub mod semaphore;
pub mod session;
mod time;

pub use config::{
    validate_address, ConfigError, LeaseConfig, VvmConfig, VvmConfigBuilder, ACQUISITION_DEFAULT,
    ACQUISITION_FOREVER, ACQUISITION_MAX, ADDRESS_MAX_BYTES, LEASE_DEFAULT, LEASE_MAX, LEASE_MIN,
    RENEWAL_CALLS_PER_LEASE_MAX, RETRY_DOUBLINGS_MAX, ROUND_INTERVAL_DEFAULT, SLOTS_MAX,
};
pub use effect::{
    Effect, Effects, FencingToken, FencingTokenError, Incarnation, LossReason, OpId, Problem,
    Record, Refusal, Reply, Revision, Slot, TimerId, TimerKind, EFFECTS_MAX,
};
pub use holding::{HoldingEvent, HoldingState, SessionLeadership};
pub use leadership::{Held, Leadership, LeaseEvent, LeaseState, Pending};
pub use lifecycle::{Lifecycle, Phase, Round, VvmEvent, VvmState, EXPIRY_RETRY_MIN};
// The rest of the semaphore's vocabulary (`Status`, `Outcome`, ...) is used as
// `vvm_core::semaphore::*`: the names are too general for the crate root.
pub use semaphore::{Semaphore, SemaphoreError, SemaphoreName};
pub use session::{
    AttachRefusal, HoldingId, Liveness, OpenRefusal, Session, SessionEffect, SessionEffects,
    SessionEvent, SessionId, SessionKey, SessionState, HOLDINGS_MAX, SESSION_EFFECTS_MAX,
};

pub use time::Instant;
