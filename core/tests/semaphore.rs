//! Exact outcomes of semaphore operations, one rule at a time (see `specs/semaphore.md`).

use vvm_core::semaphore::*;
use vvm_core::{Incarnation, SessionId};

/// Session of process `n`.
fn s(n: u64) -> SessionKey {
    SessionKey {
        incarnation: Incarnation(n),
        id: SessionId(1),
    }
}

fn sem(limit: u64) -> Semaphore {
    Semaphore::create(None, "lock", limit, Vec::new()).unwrap()
}

const T: u64 = 5_000;
/// The request id of every call where late calls are not the point.
const R: RequestId = RequestId(1);

fn granted(order_id: u64, token: u64) -> Status {
    Status::Granted {
        order_id: OrderId(order_id),
        token: Generation(token),
    }
}

fn queued(order_id: u64) -> Status {
    Status::Queued {
        order_id: OrderId(order_id),
    }
}

fn grant(n: u64, order_id: u64, token: u64) -> Grant {
    Grant {
        session: s(n),
        order_id: OrderId(order_id),
        token: Generation(token),
    }
}

const NONE: Changes = Changes {
    data: false,
    limit: false,
    owners: false,
    waiters: false,
};
const OWNERS: Changes = Changes {
    data: false,
    limit: false,
    owners: true,
    waiters: false,
};
const WAITERS: Changes = Changes {
    data: false,
    limit: false,
    owners: false,
    waiters: true,
};
const BOTH: Changes = Changes {
    data: false,
    limit: false,
    owners: true,
    waiters: true,
};

fn outcome(status: Status, changes: Changes, granted: Vec<Grant>) -> Outcome {
    Outcome {
        status,
        changes,
        granted,
        delete: false,
    }
}

fn sessions_of(owners: &[Owner]) -> Vec<SessionKey> {
    owners.iter().map(|o| o.session).collect()
}

fn waiting(sem: &Semaphore) -> Vec<SessionKey> {
    sem.waiters().iter().map(|w| w.session).collect()
}

// covers: Sem.Name
#[test]
fn names_are_short_printable_and_not_empty() {
    assert_eq!(SemaphoreName::new(""), Err(NameError::Empty));
    let longest = "é".repeat(127) + "x"; // 255 bytes
    assert_eq!(SemaphoreName::new(&longest).unwrap().as_str(), longest);
    assert_eq!(
        SemaphoreName::new(&(longest + "x")),
        Err(NameError::TooLong { bytes: 256 })
    );
    assert_eq!(
        SemaphoreName::new("a\nb"),
        Err(NameError::Control { at: 1 })
    );
    assert_eq!(
        SemaphoreName::new("ab\u{7f}"),
        Err(NameError::Control { at: 2 })
    );
    assert_eq!(
        SemaphoreName::new("é\u{85}"),
        Err(NameError::Control { at: 2 })
    );
    assert_eq!(SemaphoreName::new("\0"), Err(NameError::Control { at: 0 }));
    for fine in ["my-service/leader", "a b", "объект:42", "x"] {
        assert_eq!(SemaphoreName::new(fine).unwrap().to_string(), fine);
    }
    assert_eq!(
        Semaphore::create(None, "bad\tname", 1, Vec::new()),
        Err(SemaphoreError::InvalidName(NameError::Control { at: 3 }))
    );
    assert_eq!(
        Semaphore::ephemeral(""),
        Err(SemaphoreError::InvalidName(NameError::Empty))
    );
}

// covers: Sem.Create
#[test]
fn create_checks_limit_data_and_existence() {
    let config = Semaphore::create(None, "config", 3, vec![7; DATA_BYTES_MAX]).unwrap();
    assert_eq!(config.name().as_str(), "config");
    assert_eq!((config.limit(), config.data().len()), (3, DATA_BYTES_MAX));
    assert!(!config.is_ephemeral() && config.is_empty());
    assert_eq!(
        (config.generation(), config.next_order_id(), config.count()),
        (Generation(0), OrderId(1), 0)
    );
    assert_eq!(
        Semaphore::create(Some(&config), "config", 3, Vec::new()),
        Err(SemaphoreError::AlreadyExists(
            SemaphoreName::new("config").unwrap()
        ))
    );
    assert_eq!(
        Semaphore::create(None, "c", 0, Vec::new()),
        Err(SemaphoreError::LimitZero)
    );
    assert_eq!(
        Semaphore::create(None, "c", 1, vec![0; DATA_BYTES_MAX + 1]),
        Err(SemaphoreError::DataTooLarge {
            bytes: DATA_BYTES_MAX + 1,
            max: DATA_BYTES_MAX
        })
    );
}

// covers: Sem.CountRange, Sem.Changes
#[test]
fn counts_outside_one_to_limit_and_large_data_are_refused_and_change_nothing() {
    let mut lock = sem(2);
    lock.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    let before = lock.clone();
    assert_eq!(
        lock.acquire(s(2), R, 0, Vec::new(), T),
        Err(SemaphoreError::CountOutOfRange { count: 0, limit: 2 })
    );
    assert_eq!(
        lock.acquire(s(2), R, 3, Vec::new(), T),
        Err(SemaphoreError::CountOutOfRange { count: 3, limit: 2 })
    );
    assert_eq!(
        lock.acquire(s(1), R, 1, vec![0; PARTY_DATA_BYTES_MAX + 1], T),
        Err(SemaphoreError::DataTooLarge {
            bytes: PARTY_DATA_BYTES_MAX + 1,
            max: PARTY_DATA_BYTES_MAX
        })
    );
    assert_eq!(lock, before);
    let most = lock
        .acquire(s(2), R, 1, vec![1; PARTY_DATA_BYTES_MAX], T)
        .unwrap();
    assert_eq!(most.status, granted(2, 2));
}

// covers: Sem.GrantAtOnce, Sem.Changes
#[test]
fn an_acquire_that_fits_with_nobody_queued_is_granted_at_once() {
    let mut lock = sem(3);
    assert_eq!(
        lock.acquire(s(1), R, 2, b"a".to_vec(), T),
        Ok(outcome(granted(1, 1), BOTH, vec![]))
    );
    assert_eq!(
        lock.acquire(s(2), R, 1, b"b".to_vec(), 0),
        Ok(outcome(granted(2, 2), BOTH, vec![]))
    );
    assert_eq!(lock.count(), 3);
    assert_eq!(
        lock.owners(),
        [
            Owner {
                order_id: OrderId(1),
                session: s(1),
                request: R,
                count: 2,
                data: b"a".to_vec(),
                timeout_ms: T,
                token: Generation(1)
            },
            Owner {
                order_id: OrderId(2),
                session: s(2),
                request: R,
                count: 1,
                data: b"b".to_vec(),
                timeout_ms: 0,
                token: Generation(2)
            },
        ]
    );
}

// covers: Sem.Fifo
#[test]
fn a_head_that_does_not_fit_blocks_those_behind_it() {
    let mut lock = sem(3);
    lock.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    // 2 units free: s2 asks for 3 and queues...
    assert_eq!(
        lock.acquire(s(2), R, 3, Vec::new(), T),
        Ok(outcome(queued(2), WAITERS, vec![]))
    );
    // ...and s3, which would fit, queues behind it instead of overtaking.
    assert_eq!(
        lock.acquire(s(3), R, 1, Vec::new(), T),
        Ok(outcome(queued(3), WAITERS, vec![]))
    );
    assert_eq!(sessions_of(lock.owners()), [s(1)]);
    assert_eq!(waiting(&lock), [s(2), s(3)]);
    assert_eq!(lock.count(), 1);

    // The owner leaves: the head takes all three units, s3 still waits its turn.
    let out = lock.release(s(1), R);
    assert_eq!(out.granted, [grant(2, 2, 2)]);
    assert_eq!(waiting(&lock), [s(3)]);
    let out = lock.release(s(2), R);
    assert_eq!(out.granted, [grant(3, 3, 3)]);
}

// covers: Sem.TryOnce, Sem.Changes
#[test]
fn a_timeout_of_zero_is_granted_now_or_never_queued() {
    let mut lock = sem(1);
    assert_eq!(
        lock.acquire(s(1), R, 1, Vec::new(), 0).unwrap().status,
        granted(1, 1)
    );
    let before = lock.clone();
    assert_eq!(
        lock.acquire(s(2), R, 1, Vec::new(), 0),
        Ok(outcome(Status::NotGranted, NONE, vec![]))
    );
    assert_eq!(lock, before, "a failed try uses no order id");

    // Units free but someone queued: the try does not overtake.
    let mut lock = sem(3);
    lock.acquire(s(1), R, 2, Vec::new(), T).unwrap();
    lock.acquire(s(2), R, 2, Vec::new(), T).unwrap();
    assert_eq!(
        lock.acquire(s(3), R, 1, Vec::new(), 0),
        Ok(outcome(Status::NotGranted, NONE, vec![]))
    );
}

// covers: Sem.TryOnce, Sem.ReleaseGrantsInOrder
#[test]
fn a_queued_request_replaced_by_a_failed_try_leaves_the_queue() {
    let mut lock = sem(2);
    lock.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    lock.acquire(s(2), R, 2, Vec::new(), T).unwrap(); // the blocking head
    lock.acquire(s(3), R, 1, Vec::new(), T).unwrap();
    // s2 retries with 2 units and timeout 0: still no room, so it leaves, and s3 behind it fits.
    assert_eq!(
        lock.acquire(s(2), R, 2, Vec::new(), 0),
        Ok(outcome(Status::NotGranted, BOTH, vec![grant(3, 3, 2)]))
    );
    assert_eq!(sessions_of(lock.owners()), [s(1), s(3)]);
    assert!(lock.waiters().is_empty());
}

// covers: Sem.ReplaceInPlace, Sem.ReleaseGrantsInOrder
#[test]
fn an_owner_acquiring_again_lowers_its_hold_in_place() {
    let mut lock = sem(3);
    lock.acquire(s(1), R, 3, b"old".to_vec(), T).unwrap();
    lock.acquire(s(2), R, 2, Vec::new(), T).unwrap();
    // Exclusive to shared: same order id and token, new data; two units go to the head.
    assert_eq!(
        lock.acquire(s(1), R, 1, b"new".to_vec(), 9),
        Ok(outcome(granted(1, 1), BOTH, vec![grant(2, 2, 2)]))
    );
    assert_eq!(lock.owners()[0].data, b"new");
    assert_eq!(lock.owners()[0].timeout_ms, 9);
    // The same parameters again change nothing.
    assert_eq!(
        lock.acquire(s(1), R, 1, b"new".to_vec(), 9),
        Ok(outcome(granted(1, 1), NONE, vec![]))
    );
    // Only the data: the owners changed, nobody granted.
    assert_eq!(
        lock.acquire(s(1), R, 1, b"newer".to_vec(), 9),
        Ok(outcome(granted(1, 1), OWNERS, vec![]))
    );
}

// covers: Sem.ReplaceInPlace
#[test]
fn a_waiter_acquiring_again_keeps_its_place_and_is_not_recursive() {
    let mut lock = sem(2);
    lock.acquire(s(1), R, 2, Vec::new(), T).unwrap();
    lock.acquire(s(2), R, 1, Vec::new(), T).unwrap();
    lock.acquire(s(3), R, 1, Vec::new(), T).unwrap();
    // s2 raises its request (allowed while waiting) and changes its data: still first.
    assert_eq!(
        lock.acquire(s(2), R, 2, b"x".to_vec(), 7),
        Ok(outcome(queued(2), WAITERS, vec![]))
    );
    assert_eq!(waiting(&lock), [s(2), s(3)]);
    let w = &lock.waiters()[0];
    assert_eq!(
        (w.count, w.data.as_slice(), w.timeout_ms),
        (2, &b"x"[..], 7)
    );
    // Acquired twice, released once: nothing of s2 is left.
    assert_eq!(
        lock.release(s(2), R).status,
        Status::Withdrawn {
            order_id: OrderId(2)
        }
    );
    assert_eq!(lock.release(s(2), R).status, Status::NotHeld);
    assert_eq!(waiting(&lock), [s(3)]);
}

// covers: Sem.ReplaceInPlace
#[test]
fn a_waiter_lowering_its_request_at_the_head_is_granted_by_it() {
    let mut lock = sem(3);
    lock.acquire(s(1), R, 2, Vec::new(), T).unwrap();
    lock.acquire(s(2), R, 2, Vec::new(), T).unwrap();
    lock.acquire(s(3), R, 1, Vec::new(), T).unwrap();
    // s2 now fits; its own grant is its status, only s3 is listed for waking... and s3 does not
    // fit any more (3 units held).
    assert_eq!(
        lock.acquire(s(2), R, 1, Vec::new(), T),
        Ok(outcome(granted(2, 2), BOTH, vec![]))
    );
    assert_eq!(waiting(&lock), [s(3)]);
}

// covers: Sem.NoRaise
#[test]
fn an_owner_may_not_raise_its_hold() {
    let mut lock = sem(5);
    lock.acquire(s(1), R, 2, Vec::new(), T).unwrap();
    let before = lock.clone();
    assert_eq!(
        lock.acquire(s(1), R, 3, Vec::new(), T),
        Err(SemaphoreError::OwnerCountRaised { held: 2, asked: 3 })
    );
    assert_eq!(lock, before);
}

// covers: Sem.ReleaseGrantsInOrder, Sem.Token
#[test]
fn a_release_grants_the_queue_from_its_head_while_it_fits() {
    let mut lock = sem(2);
    lock.acquire(s(1), R, 2, Vec::new(), T).unwrap();
    for (n, count) in [(2, 1), (3, 1), (4, 2)] {
        lock.acquire(s(n), R, count, Vec::new(), T).unwrap();
    }
    assert_eq!(
        lock.release(s(1), R),
        outcome(
            Status::Released {
                order_id: OrderId(1)
            },
            BOTH,
            vec![grant(2, 2, 2), grant(3, 3, 3)]
        )
    );
    assert_eq!(waiting(&lock), [s(4)]);
    // One unit free, s4 needs two.
    assert_eq!(
        lock.release(s(2), R),
        outcome(
            Status::Released {
                order_id: OrderId(2)
            },
            OWNERS,
            vec![]
        )
    );
    assert_eq!(lock.release(s(3), R).granted, [grant(4, 4, 4)]);
    assert_eq!(lock.generation(), Generation(4));
}

// covers: Sem.Expire
#[test]
fn an_expired_session_is_released_and_cannot_be_refused() {
    let mut lock = sem(1);
    lock.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    lock.acquire(s(2), R, 1, Vec::new(), T).unwrap();
    lock.acquire(s(3), R, 1, Vec::new(), T).unwrap();
    let mut released = lock.clone();
    assert_eq!(lock.expire_session(s(1)), released.release(s(1), R));
    assert_eq!(lock, released);
    assert_eq!(
        lock.expire_session(s(3)).status,
        Status::Withdrawn {
            order_id: OrderId(3)
        }
    );
    assert_eq!(
        lock.expire_session(s(3)),
        outcome(Status::NotHeld, NONE, vec![])
    );
}

// covers: Sem.WaiterTimeout
#[test]
fn a_timeout_ends_a_queued_request_but_never_a_grant() {
    let mut lock = sem(2);
    lock.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    lock.acquire(s(2), R, 2, Vec::new(), T).unwrap();
    lock.acquire(s(3), R, 1, Vec::new(), T).unwrap();
    // T1: the blocking head times out; s3 behind it fits.
    assert_eq!(
        lock.cancel_waiter_timeout(s(2), R),
        outcome(
            Status::Withdrawn {
                order_id: OrderId(2)
            },
            BOTH,
            vec![grant(3, 3, 2)]
        )
    );
    // T2: s3 was granted before its timeout was handled; the grant stays.
    let before = lock.clone();
    assert_eq!(
        lock.cancel_waiter_timeout(s(3), R),
        outcome(Status::NotHeld, NONE, vec![])
    );
    assert_eq!(lock, before);
    assert_eq!(
        lock.cancel_waiter_timeout(s(9), R),
        outcome(Status::NotHeld, NONE, vec![])
    );
}

/// A call the store applies after the session moved on acts on nothing the session asked
/// since: a late release leaves a later grant, a late acquire is refused, a late timeout
/// leaves a request that replaced the one it names.
// covers: Sem.RequestIds
#[test]
fn late_calls_act_on_nothing_newer() {
    let r = RequestId;
    let mut lock = sem(1);
    // s1's release r(1) was sent, then its acquire r(2); the release lands last.
    assert_eq!(
        lock.acquire(s(1), r(2), 1, Vec::new(), T).unwrap().status,
        granted(1, 1)
    );
    lock.acquire(s(2), r(1), 1, Vec::new(), T).unwrap();
    let before = lock.clone();
    assert_eq!(
        lock.release(s(1), r(1)),
        outcome(Status::Superseded, NONE, vec![])
    );
    assert_eq!(lock, before, "the grant of r(2) stays, s2 stays queued");
    // A late acquire (r(1) again, with another count) is refused.
    assert_eq!(
        lock.acquire(s(1), r(1), 1, b"old".to_vec(), 0),
        Err(SemaphoreError::StaleRequest { given: 1, party: 2 })
    );
    assert_eq!(lock, before);
    // The same call sent twice acts once; a later one replaces in place.
    assert_eq!(
        lock.acquire(s(1), r(2), 1, Vec::new(), T).unwrap(),
        outcome(granted(1, 1), NONE, vec![])
    );
    assert_eq!(
        lock.acquire(s(1), r(3), 1, b"new".to_vec(), T).unwrap(),
        outcome(granted(1, 1), OWNERS, vec![])
    );
    assert_eq!(lock.owners()[0].request, r(3));
    // s2 queued by r(1), replaced by r(4): the timeout of r(1) leaves r(4)'s request queued.
    lock.acquire(s(2), r(4), 1, b"again".to_vec(), T).unwrap();
    let before = lock.clone();
    assert_eq!(
        lock.cancel_waiter_timeout(s(2), r(1)),
        outcome(Status::Superseded, NONE, vec![])
    );
    assert_eq!(lock, before);
    assert_eq!(
        lock.cancel_waiter_timeout(s(2), r(4)),
        outcome(
            Status::Withdrawn {
                order_id: OrderId(2)
            },
            WAITERS,
            vec![]
        )
    );
    // A release as new as the grant's request, or newer, ends it; expiry ends whatever.
    assert!(matches!(
        lock.release(s(1), r(3)).status,
        Status::Released { .. }
    ));
    lock.acquire(s(3), r(9), 1, Vec::new(), T).unwrap();
    assert!(matches!(
        lock.expire_session(s(3)).status,
        Status::Released { .. }
    ));
}

// covers: Sem.Token
#[test]
fn tokens_rise_with_every_grant_and_continue_across_re_creation() {
    let mut lock = sem(1);
    let mut tokens = Vec::new();
    for n in 1..=4 {
        lock.acquire(s(n), R, 1, Vec::new(), T).unwrap();
    }
    tokens.push(lock.owners()[0].token);
    for n in 1..=3 {
        tokens.push(lock.release(s(n), R).granted[0].token);
    }
    assert_eq!(tokens, [1, 2, 3, 4].map(Generation));
    assert_eq!(lock.generation(), Generation(4));

    // The name is deleted and created again: the store passes the old counters on.
    let (generation, next) = (lock.generation(), lock.next_order_id());
    lock.delete(true).unwrap();
    let mut again = sem(1).resume(generation, next);
    assert_eq!(
        again.acquire(s(1), R, 1, Vec::new(), T).unwrap().status,
        granted(5, 5)
    );
    // Counters never move back.
    let again = again.resume(Generation(1), OrderId(1));
    assert_eq!(
        (again.generation(), again.next_order_id()),
        (Generation(5), OrderId(6))
    );
}

// covers: Sem.Token
#[test]
fn counters_near_their_end_refuse_new_parties_instead_of_wrapping() {
    let mut lock = sem(1).resume(Generation(u64::MAX), OrderId(1));
    assert_eq!(lock.generation(), Generation(u64::MAX));
    assert_eq!(
        lock.acquire(s(1), R, 1, Vec::new(), T),
        Err(SemaphoreError::Exhausted)
    );
    let mut lock = sem(1).resume(Generation(u64::MAX - 2), OrderId(u64::MAX - 1));
    lock.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    assert_eq!(
        lock.acquire(s(2), R, 1, Vec::new(), T),
        Err(SemaphoreError::Exhausted)
    );
    assert_eq!(
        lock.release(s(1), R).status,
        Status::Released {
            order_id: OrderId(u64::MAX - 1)
        }
    );
}

// covers: Sem.Ephemeral
#[test]
fn an_ephemeral_semaphore_lives_from_its_first_acquire_to_its_last_release() {
    let mut object = Semaphore::ephemeral("object-42").unwrap();
    assert_eq!(object.limit(), EPHEMERAL_LIMIT);
    assert!(object.is_ephemeral() && object.data().is_empty());
    // Exclusive: all units.
    assert_eq!(
        object.acquire(s(1), R, u64::MAX, Vec::new(), T),
        Ok(outcome(granted(1, 1), BOTH, vec![]))
    );
    assert_eq!(
        object.acquire(s(2), R, 1, Vec::new(), T),
        Ok(outcome(queued(2), WAITERS, vec![]))
    );
    let out = object.release(s(1), R);
    assert_eq!((out.granted, out.delete), (vec![grant(2, 2, 2)], false));
    assert_eq!(
        object.release(s(2), R),
        Outcome {
            status: Status::Released {
                order_id: OrderId(2)
            },
            changes: OWNERS,
            granted: vec![],
            delete: true
        }
    );
    // Every way out of the last party says delete; a state with a party never does.
    let release = |s: &mut Semaphore, k| s.release(k, R);
    let timeout = |s: &mut Semaphore, k| s.cancel_waiter_timeout(k, R);
    for leave in [release, Semaphore::expire_session, timeout] {
        let mut object = Semaphore::ephemeral("object").unwrap();
        object.acquire(s(1), R, 1, Vec::new(), T).unwrap();
        let waits = object.acquire(s(2), R, u64::MAX, Vec::new(), T).unwrap();
        assert!(!waits.delete);
        assert!(!leave(&mut object, s(2)).delete);
        assert!(object.cancel_waiter_timeout(s(1), R).status == Status::NotHeld);
        assert!(object.release(s(1), R).delete);
    }
    // A release of an ephemeral name the store does not hold: nothing to keep.
    let mut fresh = Semaphore::ephemeral("object").unwrap();
    assert_eq!(
        fresh.release(s(1), R),
        Outcome {
            status: Status::NotHeld,
            changes: NONE,
            granted: vec![],
            delete: true
        }
    );
}

// covers: Sem.Delete
#[test]
fn delete_is_refused_while_parties_remain_unless_forced() {
    let mut lock = sem(1);
    assert_eq!(
        lock.delete(false),
        Ok(Outcome {
            status: Status::Deleted {
                owners: vec![],
                waiters: vec![]
            },
            changes: NONE,
            granted: vec![],
            delete: true
        })
    );
    lock.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    lock.acquire(s(2), R, 1, Vec::new(), T).unwrap();
    let before = lock.clone();
    assert_eq!(
        lock.delete(false),
        Err(SemaphoreError::Busy {
            owners: 1,
            waiters: 1
        })
    );
    assert_eq!(lock, before);
    let out = lock.delete(true).unwrap();
    assert_eq!(
        out.status,
        Status::Deleted {
            owners: before.owners().to_vec(),
            waiters: before.waiters().to_vec()
        }
    );
    // With an owner, the record stays until it leaves (Sem.ForcedDelete).
    assert_eq!((out.changes, out.delete), (BOTH, false));
    // Without owners (so without waiters: a queue always waits behind an owner), a forced
    // delete is immediate.
    let mut idle = sem(1);
    idle.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    idle.release(s(1), R);
    let out = idle.delete(true).unwrap();
    assert_eq!((out.changes, out.delete), (NONE, true));
    assert!(idle.is_empty() && !idle.is_deleting());
}

// covers: Sem.ForcedDelete
#[test]
fn a_forced_delete_keeps_the_owners_units_counted_until_they_leave() {
    let mut lock = sem(2);
    lock.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    lock.acquire(s(2), R, 1, Vec::new(), T).unwrap();
    lock.acquire(s(3), R, 1, Vec::new(), T).unwrap();
    let before = lock.clone();
    assert_eq!(
        lock.delete(true),
        Ok(Outcome {
            status: Status::Deleted {
                owners: before.owners().to_vec(),
                waiters: before.waiters().to_vec()
            },
            changes: BOTH,
            granted: vec![],
            delete: false
        })
    );
    // The grants ended, the units did not: what the owners run may still be stopping.
    assert!(lock.is_deleting() && lock.describe().deleting);
    assert_eq!(sessions_of(lock.owners()), [s(1), s(2)]);
    assert_eq!((lock.count(), waiting(&lock)), (2, vec![]));
    let being_deleted = SemaphoreError::BeingDeleted {
        name: SemaphoreName::new("lock").unwrap(),
        owners: 2,
    };
    assert_eq!(
        being_deleted.to_string(),
        "semaphore lock is being deleted: 2 former owners still hold units; it goes when they stop"
    );
    let held = lock.clone();
    // Nobody is granted or queued, not even a former owner renewing its hold in place; the
    // name cannot be created again.
    for n in [3, 4, 1] {
        assert_eq!(
            lock.acquire(s(n), R, 1, Vec::new(), T),
            Err(being_deleted.clone())
        );
    }
    assert_eq!(
        Semaphore::create(Some(&lock), "lock", 1, Vec::new()),
        Err(being_deleted)
    );
    assert_eq!(
        lock.delete(false),
        Err(SemaphoreError::Busy {
            owners: 2,
            waiters: 0
        })
    );
    // Forced again: nothing more to end.
    assert_eq!(
        lock.delete(true),
        Ok(Outcome {
            status: Status::Deleted {
                owners: held.owners().to_vec(),
                waiters: vec![]
            },
            changes: NONE,
            granted: vec![],
            delete: false
        })
    );
    assert_eq!(lock, held);
    assert_eq!(
        Semaphore::decode(&lock.encode()),
        Ok(lock.clone()),
        "the store keeps it"
    );
    // The first to stop releases; the last one's end deletes it, by release or by expiry.
    let out = lock.release(s(1), R);
    assert_eq!(
        (out.status, out.changes, out.delete),
        (
            Status::Released {
                order_id: OrderId(1)
            },
            OWNERS,
            false
        )
    );
    assert!(lock.is_deleting() && !lock.is_spent());
    let mut by_release = lock.clone();
    assert_eq!(
        by_release.release(s(2), R),
        Outcome {
            status: Status::Released {
                order_id: OrderId(2)
            },
            changes: OWNERS,
            granted: vec![],
            delete: true
        }
    );
    assert!(by_release.is_spent());
    let out = lock.expire_session(s(2));
    assert_eq!(
        (out.status, out.delete),
        (
            Status::Released {
                order_id: OrderId(2)
            },
            true
        )
    );
}

// covers: Sem.UpdateData, Sem.Changes
#[test]
fn anyone_may_set_the_data_and_only_a_new_value_is_a_change() {
    let mut config = sem(1);
    let data = Changes { data: true, ..NONE };
    assert_eq!(
        config.update_data(b"v1".to_vec()),
        Ok(outcome(Status::Updated, data, vec![]))
    );
    assert_eq!(
        config.update_data(b"v1".to_vec()),
        Ok(outcome(Status::Updated, NONE, vec![]))
    );
    assert_eq!(
        config.update_data(vec![0; DATA_BYTES_MAX + 1]),
        Err(SemaphoreError::DataTooLarge {
            bytes: DATA_BYTES_MAX + 1,
            max: DATA_BYTES_MAX
        })
    );
    assert_eq!(config.data(), b"v1");
}

// covers: Sem.Describe
#[test]
fn describe_is_a_snapshot_of_everything() {
    let mut lock = Semaphore::create(None, "svc", 3, b"cfg".to_vec()).unwrap();
    lock.acquire(s(1), R, 2, b"e1".to_vec(), T).unwrap();
    lock.acquire(s(2), R, 2, b"e2".to_vec(), 7).unwrap();
    let d = lock.describe();
    assert_eq!(
        d,
        Description {
            name: SemaphoreName::new("svc").unwrap(),
            data: b"cfg".to_vec(),
            count: 2,
            limit: 3,
            ephemeral: false,
            deleting: false,
            generation: Generation(1),
            owners: lock.owners().to_vec(),
            waiters: vec![Waiter {
                order_id: OrderId(2),
                session: s(2),
                request: R,
                count: 2,
                data: b"e2".to_vec(),
                timeout_ms: 7
            }],
        }
    );
    lock.release(s(1), R);
    assert_eq!(
        d.owners[0].session,
        s(1),
        "a snapshot does not follow the state"
    );
}

/// A semaphore at every bound: longest name, largest data, the most parties with the largest
/// data, all owners (so the most bytes each).
fn largest() -> Semaphore {
    let name = "n".repeat(NAME_BYTES_MAX);
    let mut big = Semaphore::create(None, &name, u64::MAX, vec![1; DATA_BYTES_MAX]).unwrap();
    for n in 0..PARTIES_MAX as u64 {
        let out = big
            .acquire(s(n), R, 1, vec![2; PARTY_DATA_BYTES_MAX], u64::MAX)
            .unwrap();
        assert!(matches!(out.status, Status::Granted { .. }));
    }
    big
}

// covers: Sem.Sizes, Sem.Cost
#[test]
fn parties_are_bounded_and_the_largest_state_fits_its_encoding_bound() {
    let mut big = largest();
    let before = big.clone();
    assert_eq!(
        big.acquire(s(u64::MAX), R, 1, Vec::new(), T),
        Err(SemaphoreError::TooManyParties)
    );
    assert_eq!(big, before);
    // Replacing in place is no new party.
    assert!(big.acquire(s(7), R, 1, Vec::new(), T).is_ok());
    let bytes = before.encode();
    assert_eq!(bytes.len(), ENCODED_BYTES_MAX);
    const { assert!(ENCODED_BYTES_MAX < 1_572_864, "one etcd request") };
    assert_eq!(Semaphore::decode(&bytes), Ok(before));
    // Every operation at the bound touches only this semaphore and finishes.
    let out = big.release(s(0), R);
    assert_eq!(
        out.status,
        Status::Released {
            order_id: OrderId(1)
        }
    );
    assert_eq!(big.owners().len(), PARTIES_MAX - 1);
}

fn sample() -> Semaphore {
    let mut lock = Semaphore::create(None, "svc", 2, b"cfg".to_vec()).unwrap();
    lock.acquire(s(1), R, 2, b"e1".to_vec(), T).unwrap();
    lock.acquire(s(2), R, 1, b"e2".to_vec(), 7).unwrap();
    lock
}

// covers: Sem.Encoding
#[test]
fn the_byte_form_round_trips_and_is_compact() {
    let lock = sample();
    let bytes = lock.encode();
    // header 36, name 3, data 3, owner 58 + 2, waiter 50 + 2
    assert_eq!(bytes.len(), 36 + 3 + 3 + 60 + 52);
    assert_eq!(&bytes[..5], b"vSM\x02\x00");
    assert_eq!(Semaphore::decode(&bytes), Ok(lock));
    let object = Semaphore::ephemeral("o").unwrap();
    assert_eq!(object.encode()[4], 1, "the ephemeral flag");
    assert_eq!(Semaphore::decode(&object.encode()), Ok(object));
}

/// Bit 1 of the flags marks a semaphore being deleted; a record written before that bit
/// existed (the same bytes as any record not being deleted) decodes as not being deleted.
// covers: Sem.Encoding, Sem.ForcedDelete
#[test]
fn the_deleting_flag_round_trips_and_older_records_are_not_being_deleted() {
    // Semaphore "a" of limit 1 with one owner, as written before bit 1 existed.
    let old: &[u8] = &[
        b'v', b'S', b'M', 2, 0, 1, b'a', 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0,
        0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0x88, 0x13, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
        0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    let mut lock = Semaphore::decode(old).expect("an older record decodes");
    assert!(!lock.is_deleting());
    let mut expected = Semaphore::create(None, "a", 1, Vec::new()).unwrap();
    expected.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    assert_eq!(lock, expected);
    assert_eq!(lock.encode(), old, "written back unchanged");
    lock.delete(true).unwrap();
    let bytes = lock.encode();
    assert_eq!(bytes[4], 2, "the deleting flag");
    assert_eq!(Semaphore::decode(&bytes), Ok(lock));
}

/// A state written before parties carried request ids (version 1) decodes with request 0 for
/// each, so that any call of a session reaches them, and is written back as version 2.
// covers: Sem.Encoding, Sem.RequestIds
#[test]
fn version_1_bytes_decode_with_request_0() {
    let lock = sample();
    let v2 = lock.encode();
    // The owner after the header, name, data and party counts; the waiter after the owner's
    // 58 + 2 bytes; each one's request after five u64 fields.
    let owner = limit_at("svc") + 24 + 2 + 3 + 4;
    let waiter = owner + 60;
    let mut v1 = v2.clone();
    v1[3] = 1;
    v1.drain(waiter + 40..waiter + 48);
    v1.drain(owner + 40..owner + 48);
    let mut decoded = Semaphore::decode(&v1).expect("version 1 decodes");
    assert_eq!(decoded.owners()[0].request, RequestId(0));
    assert_eq!(decoded.waiters()[0].request, RequestId(0));
    assert_eq!(decoded.owners()[0].data, lock.owners()[0].data);
    assert_eq!(
        decoded.waiters()[0].timeout_ms,
        lock.waiters()[0].timeout_ms
    );
    assert_eq!(&decoded.encode()[..4], b"vSM\x02");
    assert_eq!(decoded.encode().len(), v2.len());
    // The first call of a session is newer than what version 1 recorded.
    assert!(matches!(
        decoded.release(s(1), RequestId(1)).status,
        Status::Released { .. }
    ));
}

/// Offset of the limit in the encoding of a semaphore named `name`.
fn limit_at(name: &str) -> usize {
    4 + 1 + 1 + name.len()
}

// covers: Sem.Encoding
#[test]
fn decode_refuses_every_other_input_with_its_reason() {
    let bytes = sample().encode();
    let patched = |at: usize, value: &[u8]| {
        let mut b = bytes.clone();
        b[at..at + value.len()].copy_from_slice(value);
        Semaphore::decode(&b)
    };
    assert_eq!(patched(0, b"x"), Err(DecodeError::Magic));
    assert_eq!(patched(3, &[3]), Err(DecodeError::Version(3)));
    assert_eq!(patched(4, &[4]), Err(DecodeError::Flags(4)));
    // Being deleted, yet with a waiter: a forced delete ends every waiter.
    assert_eq!(
        patched(4, &[2]),
        Err(DecodeError::Invalid(Violation::DeletingWithWaiters))
    );
    // Every proper prefix is truncated.
    for end in 0..bytes.len() {
        assert_eq!(
            Semaphore::decode(&bytes[..end]),
            Err(DecodeError::Truncated),
            "{end}"
        );
    }
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0, 0]);
    assert_eq!(Semaphore::decode(&longer), Err(DecodeError::Trailing(2)));
    assert_eq!(patched(6, &[0xff]), Err(DecodeError::NameNotUtf8));
    assert_eq!(
        patched(6, b"\n"),
        Err(DecodeError::Name(NameError::Control { at: 0 }))
    );
    // Limit 3 would let the waiter fit: a lost wake-up, which no operation leaves behind.
    let at = limit_at("svc");
    assert_eq!(
        patched(at, &3u64.to_le_bytes()),
        Err(DecodeError::Invalid(Violation::LostWakeUp))
    );
    assert_eq!(
        patched(at, &0u64.to_le_bytes()),
        Err(DecodeError::Invalid(Violation::LimitZero))
    );
    assert_eq!(
        patched(at, &1u64.to_le_bytes()),
        Err(DecodeError::Invalid(Violation::CountOutOfRange))
    );
    // Generation 0: the owner's token 1 was never issued.
    assert_eq!(
        patched(at + 8, &0u64.to_le_bytes()),
        Err(DecodeError::Invalid(Violation::Token))
    );
    // Next order id 2: the waiter's order id 2 was never issued.
    assert_eq!(
        patched(at + 16, &2u64.to_le_bytes()),
        Err(DecodeError::Invalid(Violation::Order))
    );
    // Data length past its bound, and a party count past PARTIES_MAX, before any allocation.
    let data_len = at + 24;
    assert_eq!(
        patched(data_len, &u16::MAX.to_le_bytes()),
        Err(DecodeError::TooLong)
    );
    let parties = data_len + 2 + 3;
    assert_eq!(
        patched(parties, &(PARTIES_MAX as u16).to_le_bytes()),
        Err(DecodeError::TooLong)
    );
    // The waiter (after the owner's 60 bytes) given the owner's session.
    let waiter = parties + 4 + 60;
    assert_eq!(
        patched(waiter + 8, &1u64.to_le_bytes()),
        Err(DecodeError::Invalid(Violation::DuplicateSession))
    );
    assert_eq!(
        patched(waiter + 32, &0u64.to_le_bytes()),
        Err(DecodeError::Invalid(Violation::ZeroTimeoutWaiter))
    );
    let ephemeral = Semaphore::decode(&{
        let mut b = bytes.clone();
        b[4] = 1;
        b
    });
    assert_eq!(
        ephemeral,
        Err(DecodeError::Invalid(Violation::EphemeralLimit))
    );
}

// covers: Sem.Invariants
#[test]
fn every_state_reached_here_obeys_the_rules() {
    for state in [
        sample(),
        sem(1),
        largest(),
        Semaphore::ephemeral("e").unwrap(),
    ] {
        assert_eq!(state.check_invariants(), Ok(()));
    }
}

// covers: Sem.SetLimit
#[test]
fn raising_the_limit_grants_the_queue_from_its_head_as_a_release_does() {
    let mut lock = sem(2);
    lock.acquire(s(1), R, 2, Vec::new(), T).unwrap();
    for (n, count) in [(2, 1), (3, 2), (4, 1)] {
        lock.acquire(s(n), R, count, Vec::new(), T).unwrap();
    }
    // 3 units: s2 fits beside s1; s3 (2 units) does not and blocks s4 (strict FIFO).
    let both = Changes {
        limit: true,
        ..BOTH
    };
    assert_eq!(
        lock.set_limit(3),
        Ok(outcome(
            Status::LimitSet { previous: 2 },
            both,
            vec![grant(2, 2, 2)]
        ))
    );
    assert_eq!((lock.limit(), lock.count()), (3, 3));
    assert_eq!(waiting(&lock), [s(3), s(4)]);
    // 6 units: s3 and s4 fit; tokens continue in grant order.
    assert_eq!(
        lock.set_limit(6),
        Ok(outcome(
            Status::LimitSet { previous: 3 },
            both,
            vec![grant(3, 3, 3), grant(4, 4, 4)]
        ))
    );
    assert_eq!(sessions_of(lock.owners()), [s(1), s(2), s(3), s(4)]);
    assert!(waiting(&lock).is_empty());
    assert_eq!((lock.count(), lock.generation()), (6, Generation(4)));
    // The same limit changes nothing.
    assert_eq!(
        lock.set_limit(6),
        Ok(outcome(Status::LimitSet { previous: 6 }, NONE, vec![]))
    );
}

// covers: Sem.SetLimit
#[test]
fn the_limit_comes_down_to_the_units_in_use_and_no_lower() {
    let mut lock = sem(5);
    lock.acquire(s(1), R, 2, Vec::new(), T).unwrap();
    lock.acquire(s(2), R, 1, Vec::new(), T).unwrap();
    let before = lock.clone();
    assert_eq!(
        lock.set_limit(2),
        Err(SemaphoreError::LimitBelowUse {
            in_use: 3,
            wanted: 2
        })
    );
    assert_eq!(lock, before, "a refused change changed something");
    let limit = Changes {
        limit: true,
        ..NONE
    };
    assert_eq!(
        lock.set_limit(3),
        Ok(outcome(Status::LimitSet { previous: 5 }, limit, vec![]))
    );
    assert_eq!((lock.limit(), lock.count()), (3, 3));
    // A queued request of 3 units keeps the limit at 3 at least, even once the owners left.
    lock.acquire(s(3), R, 3, Vec::new(), T).unwrap();
    lock.release(s(2), R);
    assert_eq!(
        lock.set_limit(2),
        Err(SemaphoreError::LimitBelowRequest {
            count: 3,
            wanted: 2
        })
    );
    assert_eq!(lock.limit(), 3);
    assert_eq!(lock.set_limit(0), Err(SemaphoreError::LimitZero));
    assert_eq!(lock.check_invariants(), Ok(()));
}

// covers: Sem.SetLimit
#[test]
fn an_ephemeral_semaphore_or_one_being_deleted_keeps_its_limit() {
    let mut ephemeral = Semaphore::ephemeral("e").unwrap();
    ephemeral.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    assert_eq!(ephemeral.set_limit(3), Err(SemaphoreError::EphemeralLimit));
    assert_eq!(ephemeral.limit(), EPHEMERAL_LIMIT);

    let mut lock = sem(1);
    lock.acquire(s(1), R, 1, Vec::new(), T).unwrap();
    lock.delete(true).unwrap();
    assert_eq!(
        lock.set_limit(2),
        Err(SemaphoreError::BeingDeleted {
            name: SemaphoreName::new("lock").unwrap(),
            owners: 1
        })
    );
    assert_eq!(lock.limit(), 1);
}
