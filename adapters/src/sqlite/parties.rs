//! The index of the semaphores' parties (`vvm_semaphore_parties`, schema version 6): one row per
//! session and semaphore it is a party of. Every write of a semaphore's state brings it from the
//! parties before to those after in the same transaction (`semaphore.rs`); the migration from
//! version 5 fills it from the stored states (`schema.rs`); ending a session reads it by the
//! session's key.

use std::collections::HashSet;

use rusqlite::Connection;
use vvm_core::semaphore::{Semaphore, SemaphoreName, SessionKey};

use super::record;

/// The sessions that are parties (owners or waiters) of `state`.
pub(super) fn parties(state: Option<&Semaphore>) -> HashSet<SessionKey> {
    state.map_or_else(HashSet::new, |state| {
        state
            .owners()
            .iter()
            .map(|owner| owner.session)
            .chain(state.waiters().iter().map(|waiter| waiter.session))
            .collect()
    })
}

/// Brings the parties' index of `name` from the parties `before` to those of `after`.
pub(super) fn index(
    tx: &Connection,
    name: &SemaphoreName,
    before: &HashSet<SessionKey>,
    after: &HashSet<SessionKey>,
) -> rusqlite::Result<()> {
    for left in before.difference(after) {
        let (incarnation, id) = record::session_columns(*left);
        tx.prepare_cached(
            "DELETE FROM vvm_semaphore_parties WHERE incarnation = ?1 AND id = ?2 AND name = ?3",
        )?
        .execute((incarnation, id, name.as_str()))?;
    }
    for joined in after.difference(before) {
        let (incarnation, id) = record::session_columns(*joined);
        tx.prepare_cached(
            "INSERT OR IGNORE INTO vvm_semaphore_parties (incarnation, id, name) VALUES (?1, ?2, ?3)",
        )?
        .execute((incarnation, id, name.as_str()))?;
    }
    Ok(())
}

/// Fills the parties' index from every stored state (the migration from schema version 5). A
/// state that cannot be decoded is left out: nothing could remove its parties anyway.
pub(super) fn index_all_parties(tx: &Connection) -> rusqlite::Result<()> {
    let rows: Vec<(String, Vec<u8>)> = tx
        .prepare("SELECT name, state FROM vvm_semaphores WHERE state IS NOT NULL")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    for (name, bytes) in rows {
        let (Ok(name), Ok(state)) = (SemaphoreName::new(&name), Semaphore::decode(&bytes)) else {
            continue;
        };
        index(tx, &name, &HashSet::new(), &parties(Some(&state)))?;
    }
    Ok(())
}
