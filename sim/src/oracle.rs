//! The safety oracle: records every interval during which a process *acts* on a slot (services
//! it started with a token of the slot have not all stopped, and the process has not died) and
//! checks, per slot, that no two processes' intervals overlap in true time and that fencing
//! tokens strictly increase. A VVM acts on one slot at a time ([`Oracle::observe`]); a process
//! with a session acts on each of its holdings' slots at once ([`Oracle::observe_slot`]).

use std::collections::BTreeMap;
use std::fmt;

use vvm_core::{FencingToken, Slot};

/// Names one process start: position in the simulation and generation (restart count).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessId {
    /// Position; also the address.
    pub index: u32,
    /// How many times this position was started before.
    pub generation: u32,
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}.{}", self.index, self.generation)
    }
}

/// `[start, end)` in true nanoseconds during which `process` acted with `token`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// Who acted.
    pub process: ProcessId,
    /// With which token (its slot is the slot acted on).
    pub token: FencingToken,
    /// First instant of acting.
    pub start_ns: u64,
    /// First instant of not acting any more.
    pub end_ns: u64,
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} slot {} revision {} during [{}, {}) ns",
            self.process, self.token.slot.0, self.token.revision.0, self.start_ns, self.end_ns
        )
    }
}

/// Something the oracle saw that the protocol forbids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two processes acted on one slot at the same instant.
    TwoLeaders {
        /// The earlier interval.
        first: Interval,
        /// The one that started before `first` ended.
        second: Interval,
    },
    /// A later tenure acted with a token not above an earlier one.
    TokenNotIncreasing {
        /// The earlier interval.
        first: Interval,
        /// The later one, whose token is not above.
        second: Interval,
    },
    /// A process handed a token to its services (acquired, renewed, started services) when its
    /// kill deadline had already passed: it acts no more, so nothing may see a token from it.
    LateToken {
        /// Who did it.
        process: ProcessId,
        /// When (true time).
        at_ns: u64,
        /// What.
        text: String,
    },
    /// Something else the simulator checks on the way (named in the text).
    Other {
        /// Who did it.
        process: ProcessId,
        /// When (true time).
        at_ns: u64,
        /// What.
        text: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::TwoLeaders { first, second } => {
                write!(f, "two acting leaders: {first} overlaps {second}")
            }
            Violation::TokenNotIncreasing { first, second } => {
                write!(f, "fencing token not increasing: {first} then {second}")
            }
            Violation::LateToken { at_ns, text, .. } | Violation::Other { at_ns, text, .. } => {
                write!(f, "at {at_ns} ns: {text}")
            }
        }
    }
}

impl Violation {
    /// Who did it and when, for violations that concern one process.
    pub fn process_at(&self) -> Option<(ProcessId, u64)> {
        match *self {
            Violation::LateToken { process, at_ns, .. }
            | Violation::Other { process, at_ns, .. } => Some((process, at_ns)),
            _ => None,
        }
    }
}

/// Collects acting intervals while the simulation runs.
#[derive(Clone, Debug, Default)]
pub struct Oracle {
    open: BTreeMap<ProcessId, (FencingToken, u64)>,
    /// Per process and slot, for processes that act on several slots at once.
    open_slots: BTreeMap<(ProcessId, Slot), (FencingToken, u64)>,
    closed: Vec<Interval>,
    violations: Vec<Violation>,
}

impl Oracle {
    /// `process` acts with `token` from `now_ns` on (or stops acting, with `None`). Called after
    /// every step of a process; a changed token closes the previous interval.
    pub fn observe(&mut self, process: ProcessId, token: Option<FencingToken>, now_ns: u64) {
        let current = self.open.get(&process).map(|&(token, _)| token);
        if current == token {
            return;
        }
        self.stop(process, now_ns);
        if let Some(token) = token {
            self.open.insert(process, (token, now_ns));
        }
    }

    /// `process` acts on `slot` with `token` from `now_ns` on (or stops acting on it, with
    /// `None`); its other slots are unchanged. A changed token closes the previous interval.
    pub fn observe_slot(
        &mut self,
        process: ProcessId,
        slot: Slot,
        token: Option<FencingToken>,
        now_ns: u64,
    ) {
        debug_assert!(
            token.is_none_or(|t| t.slot == slot),
            "a token of another slot"
        );
        let current = self
            .open_slots
            .get(&(process, slot))
            .map(|&(token, _)| token);
        if current == token {
            return;
        }
        if let Some((token, start_ns)) = self.open_slots.remove(&(process, slot)) {
            self.close(process, token, start_ns, now_ns);
        }
        if let Some(token) = token {
            self.open_slots.insert((process, slot), (token, now_ns));
        }
    }

    /// `process` stops acting at `now_ns` (killed, crashed, exited, lost the slot), on every
    /// slot.
    pub fn stop(&mut self, process: ProcessId, now_ns: u64) {
        if let Some((token, start_ns)) = self.open.remove(&process) {
            self.close(process, token, start_ns, now_ns);
        }
        if self.open_slots.is_empty() {
            return;
        }
        let slots: Vec<Slot> = self
            .open_slots
            .range((process, Slot(0))..=(process, Slot(u32::MAX)))
            .map(|(&(_, slot), _)| slot)
            .collect();
        for slot in slots {
            let (token, start_ns) = self.open_slots.remove(&(process, slot)).expect("listed");
            self.close(process, token, start_ns, now_ns);
        }
    }

    fn close(&mut self, process: ProcessId, token: FencingToken, start_ns: u64, end_ns: u64) {
        assert!(start_ns <= end_ns, "time ran backwards for {process}");
        if start_ns < end_ns {
            self.closed.push(Interval {
                process,
                token,
                start_ns,
                end_ns,
            });
        }
    }

    /// Records a violation found outside the interval check.
    pub fn flag(&mut self, process: ProcessId, at_ns: u64, text: String) {
        self.violations.push(Violation::Other {
            process,
            at_ns,
            text,
        });
    }

    /// Records a token handed out after the kill deadline.
    pub fn flag_late_token(&mut self, process: ProcessId, at_ns: u64, text: String) {
        self.violations.push(Violation::LateToken {
            process,
            at_ns,
            text,
        });
    }

    /// Closes every open interval at `end_ns` and returns all intervals, by slot and start.
    pub fn finish(&mut self, end_ns: u64) -> Vec<Interval> {
        let open: Vec<ProcessId> = self
            .open
            .keys()
            .chain(self.open_slots.keys().map(|(process, _)| process))
            .copied()
            .collect();
        for process in open {
            self.stop(process, end_ns);
        }
        let mut intervals = self.closed.clone();
        intervals.sort_by_key(|i| (i.token.slot, i.start_ns, i.end_ns, i.process));
        intervals
    }

    /// Every violation: the ones flagged on the way, then overlaps and token order per slot.
    pub fn check(&mut self, end_ns: u64) -> Vec<Violation> {
        let intervals = self.finish(end_ns);
        let mut violations = self.violations.clone();
        violations.extend(check_intervals(&intervals));
        violations
    }
}

/// Overlaps and non-increasing tokens among `intervals`, which are sorted by slot, then start.
pub fn check_intervals(intervals: &[Interval]) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut latest: Option<Interval> = None; // the interval of this slot that ends last so far
    let mut previous: Option<Interval> = None;
    for &interval in intervals {
        let slot: Slot = interval.token.slot;
        if previous.is_some_and(|p| p.token.slot != slot) {
            latest = None;
            previous = None;
        }
        if let Some(first) = latest {
            if first.end_ns > interval.start_ns && first.process != interval.process {
                violations.push(Violation::TwoLeaders {
                    first,
                    second: interval,
                });
            }
        }
        if let Some(first) = previous {
            if first.token.revision >= interval.token.revision {
                violations.push(Violation::TokenNotIncreasing {
                    first,
                    second: interval,
                });
            }
        }
        if latest.is_none_or(|l| l.end_ns < interval.end_ns) {
            latest = Some(interval);
        }
        previous = Some(interval);
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use vvm_core::Revision;

    fn at(index: u32, revision: u64, start_ns: u64, end_ns: u64) -> Interval {
        Interval {
            process: ProcessId {
                index,
                generation: 0,
            },
            token: FencingToken {
                slot: Slot(1),
                revision: Revision(revision),
            },
            start_ns,
            end_ns,
        }
    }

    // covers: Verify.CanFail
    #[test]
    fn the_oracle_sees_overlaps_and_token_reversals() {
        assert!(check_intervals(&[at(0, 1, 0, 10), at(0, 2, 10, 20), at(1, 3, 20, 30)]).is_empty());
        assert!(matches!(
            check_intervals(&[at(0, 1, 0, 100), at(1, 2, 10, 20), at(2, 3, 30, 40)])[..],
            [Violation::TwoLeaders { .. }, Violation::TwoLeaders { .. }]
        ));
        assert!(matches!(
            check_intervals(&[at(0, 5, 0, 10), at(1, 4, 10, 20)])[..],
            [Violation::TokenNotIncreasing { .. }]
        ));
    }
}
