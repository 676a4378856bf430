//! What happened in a run, in true-time order, for scenarios to assert on and for a failing seed
//! to be read. Kept only when asked for: the seed runs skip it.

use std::fmt;

use vvm_core::{Effect, Incarnation, VvmEvent};

use super::oracle::ProcessId;
use super::params::Outcome;
use super::store::{Answer, Call};

/// Why a process ended without finishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Death {
    /// Its killer fired at its kill deadline.
    Killer,
    /// It crashed (SIGKILL): no release, nothing more sent.
    Crash,
}

/// One thing that happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// A process started.
    Started {
        /// When (true time).
        at_ns: u64,
        /// Who.
        process: ProcessId,
        /// Its incarnation.
        incarnation: Incarnation,
        /// Its clock-rate error.
        rate_ppm: i32,
    },
    /// A process handled an event and produced effects.
    Handled {
        /// When (true time).
        at_ns: u64,
        /// Who.
        process: ProcessId,
        /// The event (its `now` is local time).
        event: VvmEvent,
        /// What the machine asked for.
        effects: Vec<Effect>,
    },
    /// A store call reached the store.
    Store {
        /// When (true time).
        at_ns: u64,
        /// Whose call.
        process: ProcessId,
        /// The call.
        call: Call,
        /// What the fault model did with it.
        outcome: Outcome,
        /// The store's answer, if it was applied.
        answer: Option<Answer>,
    },
    /// Anything else a scenario tells of a process.
    Line {
        /// When (true time).
        at_ns: u64,
        /// Who.
        process: ProcessId,
        /// What.
        text: String,
    },
    /// A process stopped handling events.
    Paused {
        /// When (true time).
        at_ns: u64,
        /// Who.
        process: ProcessId,
        /// Until when.
        until_ns: u64,
    },
    /// A process died.
    Died {
        /// When (true time).
        at_ns: u64,
        /// Who.
        process: ProcessId,
        /// How.
        death: Death,
    },
    /// A process exited after its shutdown finished.
    Exited {
        /// When (true time).
        at_ns: u64,
        /// Who.
        process: ProcessId,
    },
}

impl Note {
    /// When it happened (true time).
    pub fn at_ns(&self) -> u64 {
        match *self {
            Note::Started { at_ns, .. }
            | Note::Handled { at_ns, .. }
            | Note::Store { at_ns, .. }
            | Note::Paused { at_ns, .. }
            | Note::Died { at_ns, .. }
            | Note::Exited { at_ns, .. }
            | Note::Line { at_ns, .. } => at_ns,
        }
    }

    /// Whom it concerns.
    pub fn process(&self) -> ProcessId {
        match *self {
            Note::Started { process, .. }
            | Note::Handled { process, .. }
            | Note::Store { process, .. }
            | Note::Paused { process, .. }
            | Note::Died { process, .. }
            | Note::Exited { process, .. }
            | Note::Line { process, .. } => process,
        }
    }
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at_ms = self.at_ns() as f64 / 1e6;
        write!(f, "{at_ms:>12.3} ms {:>6} ", self.process().to_string())?;
        match self {
            Note::Started {
                incarnation,
                rate_ppm,
                ..
            } => write!(
                f,
                "started {incarnation:?}, clock rate error {rate_ppm} ppm"
            ),
            Note::Handled { event, effects, .. } => write!(f, "{event:?} -> {effects:?}"),
            Note::Store {
                call,
                outcome,
                answer,
                ..
            } => write!(f, "store got {call:?}: {outcome:?}, answer {answer:?}"),
            Note::Paused { until_ns, .. } => {
                write!(f, "paused until {:.3} ms", *until_ns as f64 / 1e6)
            }
            Note::Died { death, .. } => write!(f, "died: {death:?}"),
            Note::Exited { .. } => write!(f, "exited"),
            Note::Line { text, .. } => write!(f, "{text}"),
        }
    }
}
