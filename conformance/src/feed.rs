//! Change-feed cases: what every store with a feed must report (`LeaseStore::changed`). A
//! store without a feed (the default, which never resolves) does not run them.
//!
//! Only what a feed MUST do is checked: wake on a deletion and on another holder, also when the
//! change happens between the call and the first poll. Waits are bounded by [`FEED_LIMIT`], a
//! correctness bound for a loaded machine (virtual time on paused clocks).

use std::time::Duration;

use vvm::{
    store::{Lease, LeaseStore},
    Slot,
};

use crate::{value, Harness, LONG_TTL};

/// Bound of every wait for a feed that must resolve.
pub const FEED_LIMIT: Duration = Duration::from_secs(30);

const SLOT: Slot = Slot(3);

/// A holder's live record under [`SLOT`], and a waiter (another client) that has seen it.
async fn held<H: Harness>(harness: &H) -> (H::Store, H::Store, Lease) {
    let holder = harness.store().await;
    let waiter = harness.client(&holder).await;
    let held = Lease {
        value: value(1),
        revision: holder
            .insert_if_not_exists(SLOT, &value(1), LONG_TTL)
            .await
            .expect("the insert runs")
            .expect("the slot is free"),
    };
    assert_eq!(
        waiter
            .insert_if_not_exists(SLOT, &value(2), LONG_TTL)
            .await
            .expect("the insert runs"),
        None,
        "the waiter is refused"
    );
    (holder, waiter, held)
}

/// A feed subscribed before a release wakes when the record is deleted.
pub async fn feed_wakes_on_a_deletion<H: Harness>(harness: &H) {
    let (holder, waiter, held) = held(harness).await;
    let feed = waiter.changed(&[SLOT]);
    assert!(holder.compare_and_delete(SLOT, &held).await.unwrap());
    assert!(
        tokio::time::timeout(FEED_LIMIT, feed).await.is_ok(),
        "a released record wakes the waiter"
    );
}

/// A feed wakes when the record passes to another holder (a swap of its value).
pub async fn feed_wakes_on_another_holder<H: Harness>(harness: &H) {
    let (holder, waiter, held) = held(harness).await;
    let feed = waiter.changed(&[SLOT]);
    holder
        .compare_and_swap(SLOT, &held, &value(3), LONG_TTL)
        .await
        .unwrap()
        .expect("the record passes to another holder");
    assert!(
        tokio::time::timeout(FEED_LIMIT, feed).await.is_ok(),
        "a record of another holder wakes the waiter"
    );
}

/// A deletion and a reinsert made after the feed was asked for, before it was first polled,
/// still wake it.
pub async fn feed_wakes_on_a_deletion_and_reinsert_after_the_call<H: Harness>(harness: &H) {
    let (holder, waiter, held) = held(harness).await;
    let feed = waiter.changed(&[SLOT]);
    // Both before the feed is first polled: the record is live again, of another holder.
    assert!(holder.compare_and_delete(SLOT, &held).await.unwrap());
    let taker = harness.client(&holder).await;
    taker
        .insert_if_not_exists(SLOT, &value(4), LONG_TTL)
        .await
        .unwrap()
        .expect("the slot is free again");
    assert!(
        tokio::time::timeout(FEED_LIMIT, feed).await.is_ok(),
        "a change between the call and the first poll wakes the waiter"
    );
}
