//! One semaphore's state and the operations on it.

use super::{
    Changes, Generation, Grant, OrderId, Outcome, Owner, RequestId, SemaphoreError, SemaphoreName,
    SessionKey, Status, Waiter, DATA_BYTES_MAX, EPHEMERAL_LIMIT, PARTIES_MAX, PARTY_DATA_BYTES_MAX,
};

/// One semaphore: what a store keeps under its name. Every operation takes the state as read
/// inside one store transaction and leaves the state to write back; see the
/// [module](crate::semaphore) for the rules.
///
/// ```
/// use vvm_core::semaphore::*;
/// use vvm_core::{Incarnation, SessionId};
///
/// let a = SessionKey { incarnation: Incarnation(1), id: SessionId(1) };
/// let b = SessionKey { incarnation: Incarnation(2), id: SessionId(1) };
/// let mut leader = Semaphore::create(None, "leader", 1, Vec::new()).unwrap();
/// let first = leader.acquire(a, RequestId(1), 1, b"10.0.0.1:7000".to_vec(), 5_000).unwrap();
/// assert!(matches!(first.status, Status::Granted { .. }));
/// let second = leader.acquire(b, RequestId(1), 1, b"10.0.0.2:7000".to_vec(), 5_000).unwrap();
/// assert!(matches!(second.status, Status::Queued { .. }));
/// // A release `a` sent before its acquire, applied late, ends nothing.
/// assert_eq!(leader.release(a, RequestId(0)).status, Status::Superseded);
///
/// let released = leader.expire_session(a);
/// assert_eq!(released.granted[0].session, b);
/// assert_eq!(leader.owners()[0].data, b"10.0.0.2:7000");
/// assert_eq!(Semaphore::decode(&leader.encode()), Ok(leader));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Semaphore {
    pub(super) name: SemaphoreName,
    pub(super) limit: u64,
    pub(super) data: Vec<u8>,
    pub(super) ephemeral: bool,
    /// Deleted by force while it had owners: it refuses acquires and creation of its name, and
    /// goes when its last former owner leaves (see [`delete`](Self::delete)).
    pub(super) deleting: bool,
    /// Granted, in order of arrival (which is grant order: every owner came before every
    /// waiter).
    pub(super) owners: Vec<Owner>,
    /// Queued, in order of arrival.
    pub(super) waiters: Vec<Waiter>,
    /// The order id the next new acquire gets.
    pub(super) next_order_id: OrderId,
    /// The token of the last grant (0: none yet).
    pub(super) generation: Generation,
}

/// Which of a session's requests a leaving operation ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ends {
    /// A hold or a queued request, whatever call made it: expiry.
    Any,
    /// A hold or a queued request made by this call or an earlier one: release.
    UpTo(RequestId),
    /// Only the queued request made by this very call: its timeout passed.
    Queued(RequestId),
}

impl Ends {
    /// Whether the operation may act on a party last shaped by `request`; `owner` tells a hold
    /// from a queued request.
    fn reaches(self, request: RequestId, owner: bool) -> bool {
        match self {
            Ends::Any => true,
            Ends::UpTo(up_to) => request <= up_to,
            Ends::Queued(exact) => !owner && request == exact,
        }
    }
}

impl Semaphore {
    /// A new semaphore `name` of `limit` units with `data`; `existing` is what the store holds
    /// under that name, if anything.
    pub fn create(
        existing: Option<&Semaphore>,
        name: &str,
        limit: u64,
        data: Vec<u8>,
    ) -> Result<Self, SemaphoreError> {
        let name = SemaphoreName::new(name)?;
        match existing {
            Some(deleting) if deleting.deleting => return Err(deleting.being_deleted()),
            Some(_) => return Err(SemaphoreError::AlreadyExists(name)),
            None => {}
        }
        if limit == 0 {
            return Err(SemaphoreError::LimitZero);
        }
        check_data(&data, DATA_BYTES_MAX)?;
        Ok(Self::new(name, limit, data, false))
    }

    /// A new ephemeral semaphore `name`, as the first acquire of a name the store does not hold
    /// makes it: limit [`EPHEMERAL_LIMIT`], no data. It is deleted when its last party leaves
    /// ([`Outcome::delete`]), so the store never writes it without a party.
    pub fn ephemeral(name: &str) -> Result<Self, SemaphoreError> {
        let name = SemaphoreName::new(name)?;
        Ok(Self::new(name, EPHEMERAL_LIMIT, Vec::new(), true))
    }

    fn new(name: SemaphoreName, limit: u64, data: Vec<u8>, ephemeral: bool) -> Self {
        Semaphore {
            name,
            limit,
            data,
            ephemeral,
            deleting: false,
            owners: Vec::new(),
            waiters: Vec::new(),
            next_order_id: OrderId(1),
            generation: Generation(0),
        }
    }

    /// Continues the counters of a semaphore that was deleted under the same name, so that
    /// tokens and order ids never repeat across re-creation: a store that keeps
    /// [`generation`](Self::generation) and [`next_order_id`](Self::next_order_id) of a deleted
    /// semaphore passes them to its successor. Counters never move back; the generation stops
    /// short of `u64::MAX` by the room the queue needs.
    #[must_use]
    pub fn resume(mut self, generation: Generation, next_order_id: OrderId) -> Self {
        let room = u64::MAX - self.waiters.len() as u64;
        self.generation = self.generation.max(Generation(generation.0.min(room)));
        self.next_order_id = self.next_order_id.max(next_order_id);
        self.debug_check();
        self
    }

    /// Asks for `count` units for `session`, publishing `data` once granted; `timeout_ms` is how
    /// long it may stay queued (0: never queued); `request` names the call ([`RequestId`]). A
    /// session that already owns or waits replaces its request in place (see the
    /// [module](crate::semaphore)), unless its party was shaped by a later call.
    pub fn acquire(
        &mut self,
        session: SessionKey,
        request: RequestId,
        count: u64,
        data: Vec<u8>,
        timeout_ms: u64,
    ) -> Result<Outcome, SemaphoreError> {
        // Its owners' grants ended with the forced delete: no grant starts or is renewed.
        if self.deleting {
            return Err(self.being_deleted());
        }
        if count == 0 || count > self.limit {
            let limit = self.limit;
            return Err(SemaphoreError::CountOutOfRange { count, limit });
        }
        check_data(&data, PARTY_DATA_BYTES_MAX)?;
        let mut changes = Changes::default();
        let mut granted = Vec::new();
        let status = if let Some(owner) = self.owners.iter_mut().find(|o| o.session == session) {
            not_stale(owner.request, request)?;
            if count > owner.count {
                let held = owner.count;
                return Err(SemaphoreError::OwnerCountRaised { held, asked: count });
            }
            let status = Status::Granted {
                order_id: owner.order_id,
                token: owner.token,
            };
            let same = (owner.count, &owner.data, owner.timeout_ms, owner.request)
                == (count, &data, timeout_ms, request);
            if !same {
                (owner.count, owner.data, owner.timeout_ms) = (count, data, timeout_ms);
                owner.request = request;
                changes.owners = true;
            }
            // A lowered hold frees units the head of the queue may be waiting for.
            self.grant_waiters(&mut granted, &mut changes);
            status
        } else if let Some(waiter) = self.waiters.iter_mut().find(|w| w.session == session) {
            not_stale(waiter.request, request)?;
            let order_id = waiter.order_id;
            let same = (
                waiter.count,
                &waiter.data,
                waiter.timeout_ms,
                waiter.request,
            ) == (count, &data, timeout_ms, request);
            if !same {
                (waiter.count, waiter.data, waiter.timeout_ms) = (count, data, timeout_ms);
                waiter.request = request;
                changes.waiters = true;
            }
            self.grant_waiters(&mut granted, &mut changes);
            if let Some(at) = granted.iter().position(|g| g.session == session) {
                let own = granted.remove(at);
                Status::Granted {
                    order_id,
                    token: own.token,
                }
            } else if timeout_ms == 0 {
                // The try replaced the queued request and failed: neither stays.
                self.waiters.retain(|w| w.session != session);
                changes.waiters = true;
                self.grant_waiters(&mut granted, &mut changes);
                Status::NotGranted
            } else {
                Status::Queued { order_id }
            }
        } else {
            self.enter(session, request, count, data, timeout_ms, &mut changes)?
        };
        Ok(self.finish(status, changes, granted))
    }

    /// A new party: granted at once, queued, or (a try) nothing.
    fn enter(
        &mut self,
        session: SessionKey,
        request: RequestId,
        count: u64,
        data: Vec<u8>,
        timeout_ms: u64,
        changes: &mut Changes,
    ) -> Result<Status, SemaphoreError> {
        if self.owners.len() + self.waiters.len() >= PARTIES_MAX {
            return Err(SemaphoreError::TooManyParties);
        }
        // Room for one more order id, and for a token for every waiter and this one.
        let queued = self.waiters.len() as u64;
        let exhausted = self.next_order_id.0 == u64::MAX || self.generation.0 >= u64::MAX - queued;
        if exhausted {
            return Err(SemaphoreError::Exhausted);
        }
        let order_id = self.next_order_id;
        if self.waiters.is_empty() && count <= self.free() {
            self.next_order_id.0 += 1;
            self.generation.0 += 1;
            let token = self.generation;
            self.owners.push(Owner {
                order_id,
                session,
                request,
                count,
                data,
                timeout_ms,
                token,
            });
            changes.owners = true;
            changes.waiters = true; // the counters moved
            Ok(Status::Granted { order_id, token })
        } else if timeout_ms == 0 {
            Ok(Status::NotGranted)
        } else {
            self.next_order_id.0 += 1;
            self.waiters.push(Waiter {
                order_id,
                session,
                request,
                count,
                data,
                timeout_ms,
            });
            changes.waiters = true;
            Ok(Status::Queued { order_id })
        }
    }

    /// Ends `session`'s hold or queued request, unless a call later than `request` shaped it
    /// ([`Status::Superseded`]); then grants waiters from the head of the queue while they fit.
    /// Never refused: releasing twice is harmless ([`Status::NotHeld`]).
    pub fn release(&mut self, session: SessionKey, request: RequestId) -> Outcome {
        self.leave(session, Ends::UpTo(request))
    }

    /// `session` was lost: the same as its [`release`](Self::release).
    pub fn expire_session(&mut self, session: SessionKey) -> Outcome {
        self.leave(session, Ends::Any)
    }

    /// The queued request `request` of `session` timed out: it leaves the queue; then waiters
    /// are granted from the head as for a release. A request granted before its timeout was
    /// handled keeps its grant ([`Status::NotHeld`]); one replaced by a later call stays
    /// ([`Status::Superseded`]).
    pub fn cancel_waiter_timeout(&mut self, session: SessionKey, request: RequestId) -> Outcome {
        self.leave(session, Ends::Queued(request))
    }

    fn leave(&mut self, session: SessionKey, ends: Ends) -> Outcome {
        let mut changes = Changes::default();
        let mut granted = Vec::new();
        let owner = self.owners.iter().position(|o| o.session == session);
        let status = match owner {
            Some(at) if ends.reaches(self.owners[at].request, true) => {
                let owner = self.owners.remove(at);
                changes.owners = true;
                Status::Released {
                    order_id: owner.order_id,
                }
            }
            // A timeout that came after the grant leaves it alone.
            Some(_) if matches!(ends, Ends::Queued(_)) => Status::NotHeld,
            Some(_) => Status::Superseded,
            None => match self.waiters.iter().position(|w| w.session == session) {
                Some(at) if ends.reaches(self.waiters[at].request, false) => {
                    let waiter = self.waiters.remove(at);
                    changes.waiters = true;
                    Status::Withdrawn {
                        order_id: waiter.order_id,
                    }
                }
                Some(_) => Status::Superseded,
                None => Status::NotHeld,
            },
        };
        self.grant_waiters(&mut granted, &mut changes);
        self.finish(status, changes, granted)
    }

    /// Sets the semaphore's own data; anyone may, owner or not.
    pub fn update_data(&mut self, data: Vec<u8>) -> Result<Outcome, SemaphoreError> {
        check_data(&data, DATA_BYTES_MAX)?;
        let mut changes = Changes::default();
        if self.data != data {
            self.data = data;
            changes.data = true;
        }
        Ok(self.finish(Status::Updated, changes, Vec::new()))
    }

    /// Changes the limit in place, keeping every owner and waiter. The promise stays: the units
    /// in use never exceed the limit.
    ///
    /// - Raising it grants queued waiters from the head of the queue while they fit, exactly as a
    ///   release does ([`Outcome::granted`], each with the next token).
    /// - Lowering it is allowed down to the units in use now
    ///   ([`SemaphoreError::LimitBelowUse`] below that) and to the count of the largest queued
    ///   request, which could otherwise never be granted
    ///   ([`SemaphoreError::LimitBelowRequest`]). Nobody's grant is taken away.
    /// - The same limit changes nothing. A limit of 0 is refused as by [`create`](Self::create)
    ///   ([`SemaphoreError::LimitZero`]); so is any change of an ephemeral semaphore, which has no
    ///   limit ([`SemaphoreError::EphemeralLimit`]), and of one being deleted
    ///   ([`SemaphoreError::BeingDeleted`]).
    ///
    /// The status is [`Status::LimitSet`] with the limit before.
    pub fn set_limit(&mut self, limit: u64) -> Result<Outcome, SemaphoreError> {
        if self.deleting {
            return Err(self.being_deleted());
        }
        if self.ephemeral {
            return Err(SemaphoreError::EphemeralLimit);
        }
        if limit == 0 {
            return Err(SemaphoreError::LimitZero);
        }
        let in_use = self.count();
        if limit < in_use {
            return Err(SemaphoreError::LimitBelowUse {
                in_use,
                wanted: limit,
            });
        }
        if let Some(count) = self
            .waiters
            .iter()
            .map(|w| w.count)
            .filter(|&c| c > limit)
            .max()
        {
            return Err(SemaphoreError::LimitBelowRequest {
                count,
                wanted: limit,
            });
        }
        let previous = self.limit;
        let mut changes = Changes::default();
        let mut granted = Vec::new();
        if limit != previous {
            self.limit = limit;
            changes.limit = true;
            // A raise frees units the head of the queue may be waiting for; a lowering cannot
            // make anyone fit.
            self.grant_waiters(&mut granted, &mut changes);
        }
        Ok(self.finish(Status::LimitSet { previous }, changes, granted))
    }

    /// Deletes the semaphore: refused while it has owners or waiters, unless `force`, which ends
    /// them all ([`Status::Deleted`] lists them). Without owners the state left behind is empty
    /// and the store deletes the record ([`Outcome::delete`]).
    ///
    /// A forced delete of a semaphore that has owners ends their grants but cannot stop what
    /// they run at once (a command may take its grace to stop): their units stay counted so
    /// that the units in use never exceed the limit, across a re-creation too. The semaphore is
    /// then *being deleted* ([`is_deleting`](Self::is_deleting)): it refuses every acquire and
    /// the creation of its name ([`SemaphoreError::BeingDeleted`]), its waiters are gone, and
    /// it is deleted by the operation after which no owner is left (a release, or the end of
    /// the owner's session), as an ephemeral semaphore is. Forcing it again changes nothing.
    pub fn delete(&mut self, force: bool) -> Result<Outcome, SemaphoreError> {
        let (owners, waiters) = (self.owners.len(), self.waiters.len());
        if !force && owners + waiters > 0 {
            return Err(SemaphoreError::Busy { owners, waiters });
        }
        let changes = Changes {
            data: false,
            limit: false,
            // A semaphore newly being deleted changed what its owners hold: a grant no more.
            owners: owners > 0 && !self.deleting,
            waiters: waiters > 0,
        };
        let status = Status::Deleted {
            owners: if owners > 0 {
                self.deleting = true;
                self.owners.clone()
            } else {
                Vec::new()
            },
            waiters: core::mem::take(&mut self.waiters),
        };
        self.debug_check();
        Ok(Outcome {
            status,
            changes,
            granted: Vec::new(),
            delete: owners == 0,
        })
    }

    /// Grants waiters from the head of the queue while they fit; the first that does not fit
    /// stops the pass (strict FIFO).
    fn grant_waiters(&mut self, granted: &mut Vec<Grant>, changes: &mut Changes) {
        let mut free = self.free();
        let fitting = self
            .waiters
            .iter()
            .take_while(|w| {
                let fits = w.count <= free;
                if fits {
                    free -= w.count;
                }
                fits
            })
            .count();
        if fitting == 0 {
            return;
        }
        for waiter in self.waiters.drain(..fitting) {
            // Cannot pass u64::MAX: every waiter had room for its token when it entered.
            self.generation.0 = self.generation.0.saturating_add(1);
            let token = self.generation;
            granted.push(Grant {
                session: waiter.session,
                order_id: waiter.order_id,
                token,
            });
            self.owners.push(Owner {
                order_id: waiter.order_id,
                session: waiter.session,
                request: waiter.request,
                count: waiter.count,
                data: waiter.data,
                timeout_ms: waiter.timeout_ms,
                token,
            });
        }
        changes.owners = true;
        changes.waiters = true;
    }

    fn finish(&self, status: Status, changes: Changes, granted: Vec<Grant>) -> Outcome {
        self.debug_check();
        Outcome {
            status,
            changes,
            granted,
            delete: self.is_spent(),
        }
    }

    /// The refusal of an acquire or a creation while the semaphore is being deleted.
    fn being_deleted(&self) -> SemaphoreError {
        SemaphoreError::BeingDeleted {
            name: self.name.clone(),
            owners: self.owners.len(),
        }
    }

    fn debug_check(&self) {
        debug_assert_eq!(self.check_invariants(), Ok(()), "{self:?}");
    }

    /// Units left by the owners.
    fn free(&self) -> u64 {
        self.limit.saturating_sub(self.count())
    }
}

/// Refuses an acquire `given` older than the request `party` that shaped the session's party.
fn not_stale(party: RequestId, given: RequestId) -> Result<(), SemaphoreError> {
    if given < party {
        return Err(SemaphoreError::StaleRequest {
            given: given.0,
            party: party.0,
        });
    }
    Ok(())
}

fn check_data(data: &[u8], max: usize) -> Result<(), SemaphoreError> {
    if data.len() > max {
        return Err(SemaphoreError::DataTooLarge {
            bytes: data.len(),
            max,
        });
    }
    Ok(())
}
