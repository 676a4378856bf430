//! The observe cases: [`vvm::observe`] over the store reports each slot's holder first, then
//! every change of holder — taken, released, expired, passed on — and no renewal.
//!
//! A case waits for an answer at most [`ANSWER_WAIT`] (long enough for a resync on a loaded
//! machine, so a missed feed event still passes only if the resync catches it — the cases
//! check what is reported, never how fast).

use std::sync::Arc;
use std::time::Duration;

use vvm::{
    discovery::{HolderChange, ObserveOptions},
    observe, Observer,
};
use vvm::{
    session::LeaseValue,
    store::{Lease, LeaseStore},
    Slot,
};

use crate::{value, Harness, LONG_TTL};

const SLOT: Slot = Slot(1);
const OTHER_SLOT: Slot = Slot(2);
/// Longest wait for one answer.
pub const ANSWER_WAIT: Duration = Duration::from_secs(30);
/// How often the observers of these cases look at least.
const RESYNC: Duration = Duration::from_millis(100);
/// Three looks at least: long enough to see an answer that should not come.
const QUIET_WAIT: Duration = Duration::from_millis(350);

async fn observer<H: Harness>(harness: &H, store: &H::Store) -> Observer<H::Store> {
    let client = harness.client(store).await;
    observe(
        Arc::new(client),
        &[SLOT, OTHER_SLOT],
        ObserveOptions {
            resync: RESYNC,
            ..ObserveOptions::default()
        },
    )
    .expect("two distinct slots can be observed")
}

async fn next<S: LeaseStore>(observer: &mut Observer<S>) -> HolderChange {
    tokio::time::timeout(ANSWER_WAIT, observer.next())
        .await
        .expect("an answer within the wait")
        .expect("the store answers")
}

async fn insert<S: LeaseStore>(store: &S, slot: Slot, value: &LeaseValue, ttl: Duration) -> Lease {
    let revision = store
        .insert_if_not_exists(slot, value, ttl)
        .await
        .expect("insert succeeds")
        .expect("insert into an empty slot wins");
    Lease {
        value: value.clone(),
        revision,
    }
}

fn holder_of(change: &HolderChange) -> Option<&LeaseValue> {
    change.holder.as_ref().map(|holder| &holder.value)
}

/// The first answers describe every slot as it is, in the order given.
// covers: Obs.FirstAnswers
pub async fn observe_first_answers_are_the_slots_as_they_are<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let held = insert(&store, OTHER_SLOT, &value(2), LONG_TTL).await;
    let mut observer = observer(harness, &store).await;

    let first = next(&mut observer).await;
    assert_eq!(first.slot, SLOT);
    assert_eq!(first.holder, None);
    let second = next(&mut observer).await;
    assert_eq!(second.slot, OTHER_SLOT);
    let holder = second.holder.expect("slot 2 is held");
    assert_eq!(holder.value, value(2));
    assert_eq!(holder.token.slot, OTHER_SLOT);
    assert_eq!(holder.token.revision, held.revision);
    if let Some(left) = holder.time_left {
        assert!(left <= LONG_TTL, "{left:?} left of a {LONG_TTL:?} record");
    }
}

/// A slot taken, then released, is reported twice: its holder, then free.
// covers: Obs.Changes
pub async fn observe_reports_a_taken_and_a_released_slot<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let mut observer = observer(harness, &store).await;
    next(&mut observer).await;
    next(&mut observer).await;

    let lease = insert(&store, SLOT, &value(1), LONG_TTL).await;
    let taken = next(&mut observer).await;
    assert_eq!(taken.slot, SLOT);
    assert_eq!(holder_of(&taken), Some(&value(1)));

    assert!(store
        .compare_and_delete(SLOT, &lease)
        .await
        .expect("delete succeeds"));
    let released = next(&mut observer).await;
    assert_eq!(released.slot, SLOT);
    assert_eq!(released.holder, None);
}

/// A record that expires is reported free, whether or not the store deletes it.
// covers: Obs.Changes
pub async fn observe_reports_an_expired_record<H: Harness>(harness: &H) {
    let store = harness.store().await;
    insert(&store, SLOT, &value(1), harness.short_ttl()).await;
    let mut observer = observer(harness, &store).await;
    // Slot 1 may already have expired on a slow machine: then the first answer says free.
    let first = next(&mut observer).await;
    assert_eq!(first.slot, SLOT);
    next(&mut observer).await;
    if first.holder.is_some() {
        harness.expire().await;
        let expired = next(&mut observer).await;
        assert_eq!(expired.slot, SLOT);
        assert_eq!(expired.holder, None, "the expired record is reported free");
    }
}

/// Renewals by the same holder are not changes; a new holder is.
// covers: Obs.Changes
pub async fn observe_reports_a_new_holder_but_no_renewal<H: Harness>(harness: &H) {
    let store = harness.store().await;
    let mut lease = insert(&store, SLOT, &value(1), LONG_TTL).await;
    let mut observer = observer(harness, &store).await;
    assert_eq!(holder_of(&next(&mut observer).await), Some(&value(1)));
    next(&mut observer).await;

    for _ in 0..3 {
        let revision = store
            .compare_and_swap(SLOT, &lease, &value(1), LONG_TTL)
            .await
            .expect("renewal succeeds")
            .expect("renewal of the record read wins");
        lease.revision = revision;
        // The observer looks (feed, or resync) after each renewal and must find nothing to say.
        let quiet = tokio::time::timeout(QUIET_WAIT, observer.next()).await;
        assert!(quiet.is_err(), "a renewal was reported: {quiet:?}");
    }
    let revision = store
        .compare_and_swap(SLOT, &lease, &value(3), LONG_TTL)
        .await
        .expect("swap succeeds")
        .expect("swap of the record read wins");
    let passed = next(&mut observer).await;
    assert_eq!(passed.slot, SLOT);
    let holder = passed.holder.expect("slot 1 is held");
    assert_eq!(
        holder.value,
        value(3),
        "the first answer after renewals and a swap is the new holder, not a renewal"
    );
    assert_eq!(holder.token.revision, revision);
}

/// One test per observe case: `observe_cases!(#[test attribute] harness-expression);`.
#[macro_export]
macro_rules! observe_cases {
    (#[$test:meta] $harness:expr) => {
        $crate::observe_cases!(@cases #[$test] $harness;
            observe_first_answers_are_the_slots_as_they_are,
            observe_reports_a_taken_and_a_released_slot,
            observe_reports_an_expired_record,
            observe_reports_a_new_holder_but_no_renewal,
        );
    };
    (@cases #[$test:meta] $harness:expr; $($case:ident),+ $(,)?) => {
        $(
            #[$test]
            async fn $case() {
                $crate::observe::$case(&$harness).await;
            }
        )+
    };
}
