//! The semaphores' rows (`vvm_semaphores`: a state, the counters of a deleted one, a version)
//! and the index of their parties (`vvm_semaphore_parties`, schema version 6): one row per
//! session and semaphore it is a party of. Every write of a semaphore's state brings the index
//! from the parties before to those after in the same transaction ([`store`]); the migration from
//! version 5 fills it from the stored states (`schema.rs`); ending a session reads it by the
//! session's key ([`end_parties`]). The rules of the semaphores are in `semaphore.rs`; these are
//! their rows, which ending a session (`session.rs`) needs too.

use std::collections::HashSet;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, Transaction};
use vvm_core::semaphore::{Generation, OrderId, Semaphore, SemaphoreName, SessionKey};
use vvm_runtime::semaphore_store::Write;

use super::record::{self, TxError};

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

/// A semaphore's row: its state (`None` once deleted) and the counters of a deleted one.
pub(super) struct Row {
    pub(super) state: Option<Vec<u8>>,
    pub(super) counters: (Generation, OrderId),
    /// The store's revision of the row's last write.
    pub(super) version: u64,
}

pub(super) fn load(tx: &Transaction<'_>, name: &SemaphoreName) -> Result<Option<Row>, TxError> {
    Ok(tx
        .prepare_cached(
            "SELECT state, generation, next_order_id, version FROM vvm_semaphores WHERE name = ?1",
        )?
        .query_row([name.as_str()], |row| {
            let state = match row.get_ref(0)? {
                ValueRef::Blob(bytes) | ValueRef::Text(bytes) => Some(bytes.to_vec()),
                _ => None,
            };
            let counter = |index| -> rusqlite::Result<u64> {
                Ok(match row.get_ref(index)? {
                    ValueRef::Integer(value) => u64::try_from(value).unwrap_or(0),
                    _ => 0,
                })
            };
            Ok(Row {
                state,
                counters: (Generation(counter(1)?), OrderId(counter(2)?.max(1))),
                version: counter(3)?,
            })
        })
        .optional()?)
}

fn column(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Writes what a transaction decided, and the parties' index from the parties `before`;
/// whether it wrote.
pub(super) fn store(
    tx: &Transaction<'_>,
    name: &SemaphoreName,
    before: &HashSet<SessionKey>,
    write: &Write,
) -> Result<bool, TxError> {
    let after = match write {
        Write::Keep => return Ok(false),
        Write::Put(semaphore) => parties(Some(semaphore)),
        Write::Delete { .. } => HashSet::new(),
    };
    index(tx, name, before, &after)?;
    let (state, generation, next_order_id) = match write {
        Write::Keep => return Ok(false),
        Write::Put(semaphore) => (
            Some(semaphore.encode()),
            semaphore.generation(),
            semaphore.next_order_id(),
        ),
        Write::Delete {
            generation,
            next_order_id,
        } => (None, *generation, *next_order_id),
    };
    let version = record::revision_column(record::next_revision(tx)?);
    tx.prepare_cached(
        "INSERT INTO vvm_semaphores (name, state, version, generation, next_order_id) \
         VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (name) DO UPDATE SET state = excluded.state, version = excluded.version, \
           generation = excluded.generation, next_order_id = excluded.next_order_id",
    )?
    .execute((
        name.as_str(),
        state,
        version,
        column(generation.0),
        column(next_order_id.0),
    ))?;
    Ok(true)
}

/// Removes the parties of the session `key` from every semaphore it is a party of, by the
/// index (its row was deleted in the same transaction). A state that cannot be decoded is left
/// as it is.
pub(super) fn end_parties(tx: &Transaction<'_>, key: SessionKey) -> Result<(), TxError> {
    let names: Vec<String> = tx
        .prepare_cached(
            "SELECT name FROM vvm_semaphore_parties WHERE incarnation = ?1 AND id = ?2",
        )?
        .query_map(record::session_columns(key), |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    for name in names {
        let Ok(name) = SemaphoreName::new(&name) else {
            continue;
        };
        let Some(bytes) = load(tx, &name)?.and_then(|row| row.state) else {
            continue;
        };
        let Ok(state) = Semaphore::decode(&bytes) else {
            continue;
        };
        let before = parties(Some(&state));
        let write = Write::ending_session(state, key);
        store(tx, &name, &before, &write)?;
    }
    Ok(())
}
