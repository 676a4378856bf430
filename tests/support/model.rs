//! What the model checks (`tests/model_check*.rs`) share: readings of a process clock that runs
//! at a fixed rate of true time (both start at 0, a rate is in parts per million of true time),
//! the numbering of process starts, the session machine's awaited timer and store calls, and
//! the environment variables that size a check.

use core::time::Duration;

use vvm_core::{Incarnation, OpId, Session, SessionEffect, SessionState, TimerId};

/// The local reading at true time `true_ns` of a clock running at `rate_ppm`.
pub fn local(rate_ppm: u64, true_ns: u64) -> u64 {
    (u128::from(true_ns) * u128::from(rate_ppm) / 1_000_000) as u64
}

/// The first true instant at which a clock running at `rate_ppm` reads `local_ns`.
pub fn true_at(rate_ppm: u64, local_ns: u64) -> u64 {
    (u128::from(local_ns) * 1_000_000).div_ceil(u128::from(rate_ppm)) as u64
}

/// The incarnation of the `generation`-th start of process `p`, numbered from `first`.
pub fn incarnation(first: u64, p: usize, generation: u8) -> Incarnation {
    Incarnation(1000 * (p as u64 + first) + u64::from(generation))
}

/// `duration` in nanoseconds.
#[allow(dead_code)] // not every model check converts durations
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).expect("fits")
}

/// The timer the session machine waits for, if any: a firing of any other is ignored (stale).
#[allow(dead_code)] // the lease model check runs no session
pub fn awaited_timer(session: &Session) -> Option<TimerId> {
    match *session.state() {
        SessionState::Alive { timer, .. } | SessionState::RetryWait { timer, .. } => Some(timer),
        _ => None,
    }
}

/// The operation a store call of the session machine names its answer with.
#[allow(dead_code)] // the lease model check runs no session
pub fn session_op(effect: &SessionEffect) -> OpId {
    match *effect {
        SessionEffect::Create { op, .. }
        | SessionEffect::KeepAlive { op, .. }
        | SessionEffect::Delete { op, .. }
        | SessionEffect::Get { op, .. } => op,
        ref other => unreachable!("not a store call: {other:?}"),
    }
}

/// The number in the environment variable `name`, if it is set.
pub fn env_usize(name: &str) -> Option<usize> {
    let text = std::env::var(name).ok()?;
    Some(text.parse().unwrap_or_else(|_| panic!("{name}={text}")))
}
