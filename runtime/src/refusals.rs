//! Why slots were not won: collected while acquiring, completed with one read per held slot
//! when acquisition fails, so that the error says which slot and why (held by whom, a corrupt
//! or foreign record, a store failure) rather than only that none was won.

use std::collections::BTreeMap;
use std::time::Duration;

use vvm_core::{Refusal, Slot};

use crate::error::{RefusalReason, SlotRefusal};
use crate::store::{LeaseStore, StoreError};

/// Slots whose holder is read when acquisition fails; the error names no more than these.
pub(crate) const HOLDERS_READ_MAX: usize = 4;

/// The last reason per slot (at most one entry per slot).
#[derive(Debug, Default)]
pub(crate) struct Refusals(BTreeMap<Slot, RefusalReason>);

impl Refusals {
    /// Records the machine's refusal of `slot`, with the store's words for a failure.
    pub(crate) fn note(&mut self, slot: Slot, refusal: Refusal, failure: Option<String>) {
        let reason = match refusal {
            Refusal::Held => RefusalReason::Held,
            Refusal::DeadlinePassed => RefusalReason::TooLate,
            Refusal::StoreFailed => RefusalReason::Store(
                failure.unwrap_or_else(|| "the store failed (no detail was recorded)".to_owned()),
            ),
        };
        self.0.insert(slot, reason);
    }

    /// Reads the record of the first [`HOLDERS_READ_MAX`] held slots (each read bounded by
    /// `timeout`) to say who holds them, or that the record is not a lease (corrupt, or written
    /// by something else). A read that fails or finds nothing leaves the reason as it was.
    pub(crate) async fn read_holders<S: LeaseStore>(&mut self, store: &S, timeout: Duration) {
        let held: Vec<Slot> = self
            .0
            .iter()
            .filter(|(_, reason)| **reason == RefusalReason::Held)
            .map(|(slot, _)| *slot)
            .take(HOLDERS_READ_MAX)
            .collect();
        for slot in held {
            let reason = match tokio::time::timeout(timeout, store.get(slot)).await {
                Ok(Ok(Some(lease))) => RefusalReason::HeldBy(lease.value.address),
                Ok(Err(error @ StoreError::Corrupt { .. })) => {
                    RefusalReason::Store(crate::ErrorChain(&error).to_string())
                }
                Ok(Ok(None) | Err(_)) | Err(_) => continue,
            };
            self.0.insert(slot, reason);
        }
    }

    /// The reasons in slot order.
    pub(crate) fn list(&self) -> Vec<SlotRefusal> {
        self.0
            .iter()
            .map(|(slot, reason)| SlotRefusal {
                slot: *slot,
                reason: reason.clone(),
            })
            .collect()
    }
}
