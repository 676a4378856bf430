//! Leader discovery: who holds each slot, read straight from the store.

use std::time::Duration;

use vvm_core::{FencingToken, Slot, SLOTS_MAX};

use crate::store::{CallTimedOut, LeaseStore, LeaseValue, StoreError};

/// The holder of one slot at the moment it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotHolder {
    /// The slot.
    pub slot: Slot,
    /// Who holds it, with the fencing token of its last confirmed write; `None` when free.
    pub holder: Option<(LeaseValue, FencingToken)>,
}

/// Reads slots `1..=slots` one by one, each call under `timeout`. A slot whose read fails ends
/// the walk with that error: a partial table would look like free slots. At most
/// [`SLOTS_MAX`] slots are read.
///
/// # Cancel safety
///
/// Cancel safe: it only reads; dropping the future leaves nothing behind.
pub async fn leaders<S: LeaseStore>(
    store: &S,
    slots: u32,
    timeout: Duration,
) -> Result<Vec<SlotHolder>, StoreError> {
    let slots = slots.min(SLOTS_MAX);
    let mut table = Vec::with_capacity(slots as usize);
    for number in 1..=slots {
        let slot = Slot(number);
        let lease = tokio::time::timeout(timeout, store.get(slot))
            .await
            .map_err(|_| {
                StoreError::unknown(CallTimedOut {
                    call: "reading",
                    slot: number,
                    timeout,
                })
            })??;
        let holder = lease.map(|lease| {
            let token = FencingToken {
                slot,
                revision: lease.revision,
            };
            (lease.value, token)
        });
        table.push(SlotHolder { slot, holder });
    }
    Ok(table)
}
