//! Random operation sequences on one semaphore from a handful of sessions — acquires of every
//! count (valid or not), tries, replacements, releases, expiries, timeouts, data updates,
//! deletes and re-creation — and the rules that must hold after every operation, judged from
//! the state before, the state after and the outcome. Then decoding of arbitrary bytes.

use proptest::prelude::*;
use vvm_core::semaphore::*;
use vvm_core::{Incarnation, SessionId};

const SESSIONS: u8 = 5;
const STEPS_MAX: usize = 120;
const NAME: &str = "prop";

/// How many steps back a call was made: 0 for a call applied as it was made, more for one the
/// store applies late (its request id that much older than the newest).
type Late = u8;

#[derive(Clone, Debug)]
enum Op {
    /// Session, count (an index into the interesting counts), data length, timeout 0?
    Acquire(u8, u8, u8, bool, Late),
    Release(u8, Late),
    Expire(u8),
    Timeout(u8, Late),
    Update(u8),
    Delete(bool),
    /// A new limit (an index into the interesting counts).
    SetLimit(u8),
}

fn late() -> impl Strategy<Value = Late> {
    prop_oneof![6 => Just(0u8), 1 => 1u8..8]
}

fn op() -> impl Strategy<Value = Op> {
    let session = 0..SESSIONS;
    prop_oneof![
        8 => (session.clone(), any::<u8>(), 0u8..4, prop::bool::weighted(0.25), late())
            .prop_map(|(s, c, d, t, l)| Op::Acquire(s, c, d, t, l)),
        3 => (session.clone(), late()).prop_map(|(s, l)| Op::Release(s, l)),
        1 => session.clone().prop_map(Op::Expire),
        2 => (session, late()).prop_map(|(s, l)| Op::Timeout(s, l)),
        1 => (0u8..4).prop_map(Op::Update),
        1 => any::<bool>().prop_map(Op::Delete),
        1 => any::<u8>().prop_map(Op::SetLimit),
    ]
}

fn key(n: u8) -> SessionKey {
    // Two incarnations share session id 1: the pair, not the id, names a session.
    SessionKey {
        incarnation: Incarnation(u64::from(n % 3)),
        id: SessionId(u64::from(n / 3) + 1),
    }
}

/// The counts worth trying on a semaphore of `limit`: 0 and above the limit (refused), 1, 2,
/// the limit, and everything for an ephemeral one.
fn count(pick: u8, limit: u64) -> u64 {
    match pick % 6 {
        0 => 0,
        1 | 2 => 1,
        3 => 2,
        4 => limit,
        _ => limit.saturating_add(1),
    }
}

/// Data of `len` (3 is one byte over the bound).
fn data(len: u8, max: usize, fill: u8) -> Vec<u8> {
    match len {
        3 => vec![fill; max + 1],
        n => vec![fill; usize::from(n)],
    }
}

fn fresh(limit: Option<u64>) -> Semaphore {
    match limit {
        Some(limit) => Semaphore::create(None, NAME, limit, Vec::new()).unwrap(),
        None => Semaphore::ephemeral(NAME).unwrap(),
    }
}

fn owner_of(sem: &Semaphore, session: SessionKey) -> Option<&Owner> {
    sem.owners().iter().find(|o| o.session == session)
}

fn waiter_of(sem: &Semaphore, session: SessionKey) -> Option<&Waiter> {
    sem.waiters().iter().find(|w| w.session == session)
}

/// The request that made or last replaced `session`'s party in `sem`.
fn party_request(sem: &Semaphore, session: SessionKey) -> Option<RequestId> {
    owner_of(sem, session)
        .map(|o| o.request)
        .or_else(|| waiter_of(sem, session).map(|w| w.request))
}

/// Grants seen across the run: each must come after the previous one in arrival order and
/// carry the next token.
#[derive(Default)]
struct History {
    order_id: u64,
    token: u64,
}

impl History {
    fn granted(&mut self, order_id: OrderId, token: Generation) -> Result<(), TestCaseError> {
        prop_assert!(order_id.0 > self.order_id, "granted out of arrival order");
        prop_assert_eq!(token.0, self.token + 1, "a token skipped or repeated");
        self.order_id = order_id.0;
        self.token = token.0;
        Ok(())
    }
}

/// Checks one operation's outcome against the states around it.
fn judge(
    before: &Semaphore,
    after: &Semaphore,
    caller: Option<SessionKey>,
    result: &Result<Outcome, SemaphoreError>,
    history: &mut History,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(after.check_invariants(), Ok(()));
    let out = match result {
        Err(error) => {
            prop_assert_eq!(after, before, "a refused operation changed the state");
            if let SemaphoreError::StaleRequest { given, party } = *error {
                let c = caller.expect("only a session's call is stale");
                prop_assert_eq!(party_request(before, c), Some(RequestId(party)));
                prop_assert!(given < party, "refused a call that was not older");
            }
            return Ok(());
        }
        Ok(out) => out,
    };
    let deleted = matches!(out.status, Status::Deleted { .. });
    // Changes are exactly the differences.
    prop_assert_eq!(out.changes.data, before.data() != after.data());
    prop_assert_eq!(out.changes.limit, before.limit() != after.limit());
    // A semaphore newly being deleted ended its owners' grants: a change of the owners.
    let ended = before.is_deleting() != after.is_deleting();
    prop_assert_eq!(
        out.changes.owners,
        before.owners() != after.owners() || ended
    );
    let counters = before.next_order_id() != after.next_order_id();
    prop_assert_eq!(
        out.changes.waiters,
        before.waiters() != after.waiters() || counters
    );
    prop_assert_eq!(out.changes.any(), before != after);
    prop_assert_eq!(
        out.delete,
        (deleted && !after.is_deleting()) || after.is_spent()
    );
    // Being deleted refuses every acquire (caught above as a refusal), so no grant while it is.
    prop_assert!(!before.is_deleting() || out.granted.is_empty());

    // The caller's own status agrees with where it stands now.
    let was_owner = caller.and_then(|c| owner_of(before, c));
    let was_waiter = caller.and_then(|c| waiter_of(before, c));
    let now_owner = caller.and_then(|c| owner_of(after, c));
    let now_waiter = caller.and_then(|c| waiter_of(after, c));
    match out.status {
        Status::Granted { order_id, token } => {
            let owner = now_owner.expect("granted, so an owner");
            prop_assert_eq!((owner.order_id, owner.token), (order_id, token));
            match (was_owner, was_waiter) {
                (Some(old), _) => prop_assert_eq!((old.order_id, old.token), (order_id, token)),
                (None, Some(old)) => prop_assert_eq!(old.order_id, order_id),
                (None, None) => prop_assert_eq!(order_id, before.next_order_id()),
            }
        }
        Status::Queued { order_id } => {
            prop_assert_eq!(now_waiter.map(|w| w.order_id), Some(order_id));
            if let Some(old) = was_waiter {
                prop_assert_eq!(old.order_id, order_id, "a replacement moved in the queue");
            }
        }
        Status::NotGranted => prop_assert!(now_owner.is_none() && now_waiter.is_none()),
        Status::Released { order_id } => {
            prop_assert_eq!(was_owner.map(|o| o.order_id), Some(order_id));
            prop_assert!(now_owner.is_none() && now_waiter.is_none());
        }
        Status::Withdrawn { order_id } => {
            prop_assert_eq!(was_waiter.map(|w| w.order_id), Some(order_id));
            prop_assert!(now_owner.is_none() && now_waiter.is_none());
        }
        Status::NotHeld => {
            prop_assert!(was_waiter.is_none());
            prop_assert_eq!(was_owner, now_owner, "a grant ended by a timeout");
        }
        Status::Superseded => {
            prop_assert_eq!(after, before, "a late call changed something");
            prop_assert!(was_owner.is_some() || was_waiter.is_some());
        }
        Status::Updated => {}
        Status::LimitSet { previous } => {
            prop_assert_eq!(previous, before.limit());
            // Never below the units in use, nor below a queued request.
            prop_assert!(after.count() <= after.limit());
            prop_assert!(after.waiters().iter().all(|w| w.count <= after.limit()));
        }
        Status::Deleted {
            ref owners,
            ref waiters,
        } => {
            prop_assert_eq!(owners.as_slice(), before.owners());
            prop_assert_eq!(waiters.as_slice(), before.waiters());
            // The owners' units stay counted until they leave (Sem.ForcedDelete).
            prop_assert_eq!(after.owners(), before.owners());
            prop_assert!(after.waiters().is_empty());
            prop_assert_eq!(after.is_deleting(), !before.owners().is_empty());
        }
    }

    // Grants come from the head of the queue, in order, each with the next token; the caller's
    // own new grant takes its turn among them.
    let queue: Vec<&Waiter> = before
        .waiters()
        .iter()
        .filter(|w| Some(w.session) != caller)
        .collect();
    prop_assert!(out.granted.len() <= queue.len());
    let mut caller_new_grant = match (out.status.clone(), was_owner) {
        (Status::Granted { order_id, token }, None) => Some((order_id, token)),
        _ => None,
    };
    for (grant, waiter) in out.granted.iter().zip(&queue) {
        prop_assert_eq!(
            (grant.session, grant.order_id),
            (waiter.session, waiter.order_id)
        );
        if let Some((order_id, token)) = caller_new_grant.filter(|&(o, _)| o < grant.order_id) {
            history.granted(order_id, token)?;
            caller_new_grant = None;
        }
        history.granted(grant.order_id, grant.token)?;
        let owner = owner_of(after, grant.session).expect("granted, so an owner");
        prop_assert_eq!(owner.token, grant.token);
    }
    if let Some((order_id, token)) = caller_new_grant {
        history.granted(order_id, token)?;
    }
    prop_assert_eq!(
        after.generation().0,
        history.token.max(before.generation().0)
    );

    // Every reachable state survives its byte form.
    let bytes = after.encode();
    prop_assert!(bytes.len() <= ENCODED_BYTES_MAX);
    prop_assert_eq!(&Semaphore::decode(&bytes), &Ok(after.clone()));
    Ok(())
}

fn run(limit: Option<u64>, ops: Vec<Op>) -> Result<Vec<Vec<u8>>, TestCaseError> {
    let mut sem = fresh(limit);
    let mut history = History::default();
    let mut encodings = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        let before = sem.clone();
        let fill = step as u8;
        // Step n's calls are request n + 1 (ids start at 1), less how late they are.
        let request = |late: Late| RequestId((step as u64 + 1).saturating_sub(u64::from(late)));
        let (caller, result) = match op.clone() {
            Op::Acquire(s, c, d, zero, late) => {
                let count = count(c, sem.limit());
                let data = data(d, PARTY_DATA_BYTES_MAX, fill);
                let timeout_ms = if zero { 0 } else { 1_000 + u64::from(c) };
                let request = request(late);
                let result = sem.acquire(key(s), request, count, data, timeout_ms);
                if result.is_ok() {
                    let party = party_request(&sem, key(s));
                    prop_assert!(party.is_none_or(|p| p == request), "not the acquire's id");
                }
                (Some(key(s)), result)
            }
            Op::Release(s, late) => {
                let out = sem.release(key(s), request(late));
                if matches!(
                    out.status,
                    Status::Released { .. } | Status::Withdrawn { .. }
                ) {
                    let party = party_request(&before, key(s)).expect("it had a party");
                    prop_assert!(party <= request(late), "a late release ended a newer party");
                }
                (Some(key(s)), Ok(out))
            }
            Op::Expire(s) => (Some(key(s)), Ok(sem.expire_session(key(s)))),
            Op::Timeout(s, late) => {
                let out = sem.cancel_waiter_timeout(key(s), request(late));
                if matches!(out.status, Status::Withdrawn { .. }) {
                    let party = party_request(&before, key(s));
                    prop_assert_eq!(party, Some(request(late)), "a timeout of another request");
                }
                (Some(key(s)), Ok(out))
            }
            Op::Update(d) => (None, sem.update_data(data(d, DATA_BYTES_MAX, fill))),
            Op::Delete(force) => (None, sem.delete(force)),
            Op::SetLimit(pick) => {
                // Counts around the limit and the units in use: 0, 1, 2, in use, limit + 1.
                let limit = match pick % 5 {
                    0 => 0,
                    1 => 1,
                    2 => 2,
                    3 => sem.count(),
                    _ => sem.limit().saturating_add(1),
                };
                (None, sem.set_limit(limit))
            }
        };
        judge(&before, &sem, caller, &result, &mut history)?;
        if matches!(op, Op::Timeout(..)) {
            let status = result.as_ref().map(|out| &out.status);
            prop_assert!(
                !matches!(status, Ok(Status::Released { .. })),
                "a timeout ended a grant"
            );
        }
        if let Ok(out) = &result {
            if out.delete {
                // The store deletes the record and keeps the counters; the next use of the
                // name creates it again.
                let (generation, next) = (sem.generation(), sem.next_order_id());
                sem = fresh(limit).resume(generation, next);
            }
        }
        encodings.push(sem.encode());
    }
    Ok(encodings)
}

fn limit() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        Just(Some(1)),
        Just(Some(2)),
        Just(Some(3)),
        Just(Some(5)),
        Just(None),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    // covers: Sem.Invariants, Sem.Fifo, Sem.ReleaseGrantsInOrder, Sem.Token, Sem.Changes, Sem.ReplaceInPlace, Sem.Encoding, Sem.RequestIds
    #[test]
    fn semaphore_rules_hold_under_random_operations(
        limit in limit(),
        ops in prop::collection::vec(op(), 1..STEPS_MAX),
    ) {
        run(limit, ops)?;
    }

    // covers: Sem.Encoding
    #[test]
    fn decode_never_panics_and_accepts_only_what_encode_writes(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
    ) {
        if let Ok(sem) = Semaphore::decode(&bytes) {
            prop_assert_eq!(sem.check_invariants(), Ok(()));
            // Version 1 is written back as version 2; every other byte string is its own form.
            if bytes[3] != 1 {
                prop_assert_eq!(sem.encode(), bytes);
            }
        }
    }

    // covers: Sem.Encoding
    #[test]
    fn damaged_encodings_are_refused_or_encode_back_to_themselves(
        limit in limit(),
        ops in prop::collection::vec(op(), 1..40),
        pick in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<bool>(),
    ) {
        let encodings = run(limit, ops)?;
        let mut bytes = pick.get(&encodings).clone();
        let at = at.index(bytes.len());
        if cut {
            bytes.truncate(at);
        } else {
            bytes[at] = byte;
        }
        if let Ok(sem) = Semaphore::decode(&bytes) {
            prop_assert_eq!(sem.check_invariants(), Ok(()));
            if bytes[3] != 1 {
                prop_assert_eq!(sem.encode(), bytes);
            }
        }
    }
}
