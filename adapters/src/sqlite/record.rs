//! Rows of `vvm_leases`: reading them without trusting them, judging liveness, writing them.
//!
//! A row is a slot record, judged by its own boot id and expiry, or a holding of a session
//! (`session_incarnation`, `session_id` set), judged by the boot id and expiry of that
//! session's row in `vvm_sessions`, read in the same statement ([`load`]): a holding is live
//! exactly while its session is, for every operation, with no sweep. Its own expiry is
//! unused.

use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{OptionalExtension, Transaction};
use vvm_core::{Incarnation, Revision, SessionId, SessionKey, Slot};
use vvm_runtime::{Lease, LeaseValue, StoreError, ValueError};

use super::busy::is_busy;
use super::lock::FileId;
use super::SqliteStoreError;

/// Why a transaction body stopped.
#[derive(Debug)]
pub(crate) enum TxError {
    /// Another connection holds a lock: roll back and try again.
    Busy,
    /// A final answer for the caller.
    Store(StoreError),
}

impl From<rusqlite::Error> for TxError {
    fn from(error: rusqlite::Error) -> Self {
        if is_busy(&error) {
            TxError::Busy
        } else {
            TxError::Store(StoreError::failed(SqliteStoreError::Sqlite {
                what: "running a statement",
                source: error,
            }))
        }
    }
}

impl From<StoreError> for TxError {
    fn from(error: StoreError) -> Self {
        TxError::Store(error)
    }
}

/// The present, as records are judged by it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now<'a> {
    /// The host's current boot.
    pub boot_id: &'a str,
    /// Nanoseconds since that boot.
    pub ns: i64,
}

/// The comparable part of a live record; `None` where a column could not be read, which never
/// equals an expected lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stored {
    bytes: Option<Vec<u8>>,
    revision: Option<Revision>,
}

impl Stored {
    /// What a record equal to `lease` holds.
    pub(crate) fn expected(lease: &Lease) -> Self {
        Stored {
            bytes: Some(lease.value.encode().into_bytes()),
            revision: Some(lease.revision),
        }
    }

    /// Whether the record holds exactly these value bytes (the same holder).
    pub(crate) fn is_value(&self, bytes: &[u8]) -> bool {
        self.bytes.as_deref() == Some(bytes)
    }

    /// The value bytes, if the column could be read.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        self.bytes.as_deref()
    }

    /// The revision, if the column could be read as a positive integer.
    pub(crate) fn revision(&self) -> Option<Revision> {
        self.revision
    }

    /// The lease this record holds, or [`StoreError::Corrupt`].
    pub(crate) fn lease(&self, key: Slot) -> Result<Lease, StoreError> {
        let corrupt = |source| StoreError::Corrupt {
            slot: key.0,
            source,
        };
        let bytes = self.bytes.as_deref().ok_or(corrupt(ValueError::Malformed(
            "value is neither text nor a blob",
        )))?;
        let revision = self.revision.ok_or(corrupt(ValueError::Malformed(
            "revision is not a positive integer",
        )))?;
        let value = LeaseValue::decode(bytes).map_err(corrupt)?;
        Ok(Lease { value, revision })
    }
}

/// A row, judged against the present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Judged {
    /// No row, a row of another boot, or an expired one.
    Absent,
    /// A live record, and how long it has left.
    Live(Stored, Duration),
}

/// The raw columns of a row, as SQLite returned them. Pure: see [`judge`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Column {
    Integer(i64),
    Bytes(Vec<u8>),
    Other,
}

impl From<ValueRef<'_>> for Column {
    fn from(value: ValueRef<'_>) -> Self {
        match value {
            ValueRef::Integer(i) => Column::Integer(i),
            ValueRef::Text(bytes) | ValueRef::Blob(bytes) => Column::Bytes(bytes.to_vec()),
            ValueRef::Null | ValueRef::Real(_) => Column::Other,
        }
    }
}

/// The columns `value, revision, boot_id, expires_ns` of one row.
pub(crate) type Row = [Column; 4];

/// Decides whether `row` is a live record at `now`. Never panics, whatever the row holds; a
/// row whose liveness cannot be told (boot id or expiry unreadable) is corrupt.
pub(crate) fn judge(key: Slot, row: Option<&Row>, now: Now<'_>) -> Result<Judged, StoreError> {
    judge_columns(row, now).map_err(|what| StoreError::Corrupt {
        slot: key.0,
        source: ValueError::Malformed(what),
    })
}

/// [`judge`] for any row of the same four columns (a slot record, or a session record), with
/// what makes its liveness unknowable as the error.
pub(crate) fn judge_columns(row: Option<&Row>, now: Now<'_>) -> Result<Judged, &'static str> {
    let Some([value, revision, boot_id, expires_ns]) = row else {
        return Ok(Judged::Absent);
    };
    let Column::Bytes(boot_id) = boot_id else {
        return Err("boot id is not text");
    };
    if boot_id.as_slice() != now.boot_id.as_bytes() {
        return Ok(Judged::Absent);
    }
    let Column::Integer(expires_ns) = *expires_ns else {
        return Err("expiry is not an integer");
    };
    if expires_ns <= now.ns {
        return Ok(Judged::Absent);
    }
    let bytes = match value {
        Column::Bytes(bytes) => Some(bytes.clone()),
        _ => None,
    };
    let revision = match *revision {
        Column::Integer(revision) => u64::try_from(revision)
            .ok()
            .filter(|r| *r > 0)
            .map(Revision),
        _ => None,
    };
    let left = Duration::from_nanos(expires_ns.abs_diff(now.ns));
    Ok(Judged::Live(Stored { bytes, revision }, left))
}

/// Whose life a row of `vvm_leases` is: its own, or a session's. Pure: see [`judge_row`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Owner {
    /// A slot record (both session columns `NULL`): its own boot id and expiry judge it.
    Itself,
    /// A holding: the `boot_id, expires_ns` of its session's row, or `None` when that row is
    /// gone (the session was deleted; the holding is dead).
    Session(Option<[Column; 2]>),
    /// Session columns that are neither two integers nor two `NULL`s: whose life the row is
    /// cannot be told.
    Unreadable,
}

impl Owner {
    /// From the columns `session_incarnation, session_id` and, when a session row of that key
    /// was found, its `boot_id, expires_ns`.
    fn from_columns(
        incarnation: ValueRef<'_>,
        id: ValueRef<'_>,
        session: Option<[Column; 2]>,
    ) -> Self {
        match (incarnation, id) {
            (ValueRef::Null, ValueRef::Null) => Owner::Itself,
            (ValueRef::Integer(_), ValueRef::Integer(_)) => Owner::Session(session),
            _ => Owner::Unreadable,
        }
    }
}

/// Decides whether a row of `vvm_leases` is a live record at `now`: a slot record by its own
/// boot id and expiry ([`judge`]), a holding by its session's, with the holding's own value and
/// revision. A holding whose session row is gone is absent. Never panics.
pub(crate) fn judge_row(
    key: Slot,
    row: Option<(Row, Owner)>,
    now: Now<'_>,
) -> Result<Judged, StoreError> {
    let Some((row, owner)) = row else {
        return Ok(Judged::Absent);
    };
    match owner {
        Owner::Itself => judge(key, Some(&row), now),
        Owner::Session(None) => Ok(Judged::Absent),
        Owner::Session(Some([boot_id, expires_ns])) => {
            let [value, revision, _, _] = row;
            judge(key, Some(&[value, revision, boot_id, expires_ns]), now)
        }
        Owner::Unreadable => Err(StoreError::Corrupt {
            slot: key.0,
            source: ValueError::Malformed("the session of the holding is not two integers"),
        }),
    }
}

/// Reads and judges the row of `key`, a holding by its session's row (one statement).
pub(crate) fn load(tx: &Transaction<'_>, key: Slot, now: Now<'_>) -> Result<Judged, TxError> {
    let mut statement = tx.prepare_cached(
        "SELECT l.value, l.revision, l.boot_id, l.expires_ns, \
                l.session_incarnation, l.session_id, \
                s.incarnation IS NOT NULL, s.boot_id, s.expires_ns \
         FROM vvm_leases AS l LEFT JOIN vvm_sessions AS s \
           ON s.incarnation = l.session_incarnation AND s.id = l.session_id \
         WHERE l.slot = ?1",
    )?;
    let row: Option<(Row, Owner)> = statement
        .query_row([i64::from(key.0)], |row| {
            let found = matches!(row.get_ref(6)?, ValueRef::Integer(1));
            let session = match found {
                true => Some([row.get_ref(7)?.into(), row.get_ref(8)?.into()]),
                false => None,
            };
            Ok((
                [
                    row.get_ref(0)?.into(),
                    row.get_ref(1)?.into(),
                    row.get_ref(2)?.into(),
                    row.get_ref(3)?.into(),
                ],
                Owner::from_columns(row.get_ref(4)?, row.get_ref(5)?, session),
            ))
        })
        .optional()?;
    Ok(judge_row(key, row, now)?)
}

/// The columns of a session key: SQLite integers are signed, so the bits are kept and
/// reinterpreted (as for lock file identities).
pub(crate) fn session_columns(key: SessionKey) -> (i64, i64) {
    (
        i64::from_ne_bytes(key.incarnation.0.to_ne_bytes()),
        i64::from_ne_bytes(key.id.0.to_ne_bytes()),
    )
}

/// The session key of the columns [`session_columns`] wrote.
pub(crate) fn session_key(incarnation: i64, id: i64) -> SessionKey {
    SessionKey {
        incarnation: Incarnation(u64::from_ne_bytes(incarnation.to_ne_bytes())),
        id: SessionId(u64::from_ne_bytes(id.to_ne_bytes())),
    }
}

/// The session whose holding the row of `key` is, if it is one.
pub(crate) fn holding_of(tx: &Transaction<'_>, key: Slot) -> Result<Option<SessionKey>, TxError> {
    let session = tx
        .prepare_cached("SELECT session_incarnation, session_id FROM vvm_leases WHERE slot = ?1")?
        .query_row([i64::from(key.0)], |row| {
            Ok(match (row.get_ref(0)?, row.get_ref(1)?) {
                (ValueRef::Integer(incarnation), ValueRef::Integer(id)) => {
                    Some(session_key(incarnation, id))
                }
                _ => None,
            })
        })
        .optional()?;
    Ok(session.flatten())
}

/// The lock file the record under `key` names (see `lock.rs`), if any. A holding names none,
/// whatever its lock columns hold: its life is its session's.
pub(crate) fn lock_of(tx: &Transaction<'_>, key: Slot) -> Result<Option<FileId>, TxError> {
    let named = tx
        .prepare_cached(
            "SELECT lock_dev, lock_ino FROM vvm_leases \
             WHERE slot = ?1 AND session_incarnation IS NULL AND session_id IS NULL",
        )?
        .query_row([i64::from(key.0)], named_file)
        .optional()?;
    Ok(named.flatten())
}

/// The lock file the columns `lock_dev, lock_ino` (the first two of `row`) name: a value of
/// another type names nothing.
pub(crate) fn named_file(row: &rusqlite::Row<'_>) -> rusqlite::Result<Option<FileId>> {
    let int = |index: usize| -> rusqlite::Result<Option<i64>> {
        Ok(match row.get_ref(index)? {
            ValueRef::Integer(i) => Some(i),
            _ => None,
        })
    };
    Ok(FileId::from_columns(int(0)?, int(1)?))
}

/// Nanoseconds since boot at which a record written at `now_ns` for `ttl` expires.
pub(crate) fn expiry_ns(now_ns: i64, ttl: Duration) -> i64 {
    let ttl_ns = i64::try_from(ttl.as_nanos()).unwrap_or(i64::MAX);
    now_ns.saturating_add(ttl_ns)
}

/// The next revision of the store's one counter (which deletes do not reset).
pub(crate) fn next_revision(tx: &Transaction<'_>) -> Result<Revision, TxError> {
    let next: Option<i64> = tx
        .prepare_cached(
            "UPDATE vvm_store SET revision = revision + 1 WHERE id = 0 RETURNING revision",
        )?
        .query_row([], |row| row.get(0))
        .optional()?;
    match next.map(u64::try_from) {
        Some(Ok(revision)) if revision > 0 => Ok(Revision(revision)),
        _ => Err(TxError::Store(StoreError::failed(
            SqliteStoreError::Damaged {
                what: "the store's revision counter is missing or not positive".into(),
                source: None,
            },
        ))),
    }
}

/// A revision as a column (it came from one).
pub(crate) fn revision_column(revision: Revision) -> i64 {
    i64::try_from(revision.0).unwrap_or(i64::MAX)
}

/// Writes `bytes` under `key` with the next revision of the store's counter: a slot record
/// (whatever the row was before, a holding included).
pub(crate) fn write(
    tx: &Transaction<'_>,
    key: Slot,
    bytes: &[u8],
    ttl: Duration,
    now: Now<'_>,
    lock: Option<FileId>,
) -> Result<Revision, TxError> {
    let revision = next_revision(tx)?;
    tx.prepare_cached(
        "INSERT OR REPLACE INTO vvm_leases \
         (slot, value, revision, boot_id, expires_ns, lock_dev, lock_ino, \
          session_incarnation, session_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, NULL)",
    )?
    .execute((
        i64::from(key.0),
        bytes,
        revision_column(revision),
        now.boot_id,
        expiry_ns(now.ns, ttl),
        lock.map(|id| id.to_columns().0),
        lock.map(|id| id.to_columns().1),
    ))?;
    Ok(revision)
}

/// Writes a holding of `session` under `key` with the session's value `bytes` and the next
/// revision of the store's counter. It names no lock file, and its own expiry is `i64::MAX`,
/// unused: its life is the session's (see [`load`]); a reader that judged it by its own columns
/// would see it held, never free.
pub(crate) fn write_holding(
    tx: &Transaction<'_>,
    key: Slot,
    bytes: &[u8],
    session: SessionKey,
    now: Now<'_>,
) -> Result<Revision, TxError> {
    let revision = next_revision(tx)?;
    let (incarnation, id) = session_columns(session);
    tx.prepare_cached(
        "INSERT OR REPLACE INTO vvm_leases \
         (slot, value, revision, boot_id, expires_ns, lock_dev, lock_ino, \
          session_incarnation, session_id) \
         VALUES (?1, ?2, ?3, ?4, ?5, NULL, NULL, ?6, ?7)",
    )?
    .execute((
        i64::from(key.0),
        bytes,
        revision_column(revision),
        now.boot_id,
        i64::MAX,
        incarnation,
        id,
    ))?;
    // The slot's tenure: who to wait for if the row is deleted from outside (`Sq.HoldingRemoved`).
    tx.prepare_cached(
        "INSERT OR REPLACE INTO vvm_tenures (slot, session_incarnation, session_id) \
         VALUES (?1, ?2, ?3)",
    )?
    .execute((i64::from(key.0), incarnation, id))?;
    Ok(revision)
}

/// The session that last took `key` as a holding, if one did (`Sq.HoldingRemoved`).
pub(crate) fn tenure_of(tx: &Transaction<'_>, key: Slot) -> Result<Option<SessionKey>, TxError> {
    let columns: Option<(i64, i64)> = tx
        .prepare_cached("SELECT session_incarnation, session_id FROM vvm_tenures WHERE slot = ?1")?
        .query_row([i64::from(key.0)], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    Ok(columns.map(|(incarnation, id)| session_key(incarnation, id)))
}

/// Retires the row of `key` after its holder's own release: it stays, with no holder, boot or
/// expiry, as the sign that the slot was given up rather than taken away. A candidate that finds
/// no row at all while another process holds the slot's lock cannot tell a released slot from a
/// record deleted from outside (or a store file replaced) under a holder that may still act, and
/// waits (see `insert` in `mod.rs`); a retired row tells it.
pub(crate) fn retire(tx: &Transaction<'_>, key: Slot) -> Result<(), TxError> {
    tx.prepare_cached(
        "UPDATE vvm_leases SET boot_id = '', expires_ns = 0, lock_dev = NULL, \
         lock_ino = NULL, session_incarnation = NULL, session_id = NULL WHERE slot = ?1",
    )?
    .execute([i64::from(key.0)])?;
    Ok(())
}

/// Whether `key` has a row at all, live, expired or retired.
pub(crate) fn row_exists(tx: &Transaction<'_>, key: Slot) -> Result<bool, TxError> {
    Ok(tx
        .prepare_cached("SELECT 1 FROM vvm_leases WHERE slot = ?1")?
        .query_row([i64::from(key.0)], |_| Ok(()))
        .optional()?
        .is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vvm_core::Incarnation;

    const BOOT: &str = "boot-a";
    const NOW: Now<'static> = Now {
        boot_id: BOOT,
        ns: 1_000,
    };
    const KEY: Slot = Slot(7);

    fn row(value: Column, revision: Column, boot_id: Column, expires_ns: Column) -> Row {
        [value, revision, boot_id, expires_ns]
    }

    fn lease() -> Lease {
        Lease {
            value: LeaseValue {
                address: "10.0.0.1:7000".into(),
                incarnation: Incarnation(3),
                stopping: false,
            },
            revision: Revision(5),
        }
    }

    fn good(expires_ns: i64) -> Row {
        let bytes = lease().value.encode().into_bytes();
        row(
            Column::Bytes(bytes),
            Column::Integer(5),
            Column::Bytes(BOOT.into()),
            Column::Integer(expires_ns),
        )
    }

    // covers: Sq.Corrupt
    #[test]
    fn a_live_row_reads_back_as_its_lease() {
        let Judged::Live(stored, left) = judge(KEY, Some(&good(1_001)), NOW).unwrap() else {
            panic!("live row judged absent");
        };
        assert_eq!(stored, Stored::expected(&lease()));
        assert_eq!(stored.lease(KEY).unwrap(), lease());
        assert_eq!(left, Duration::from_nanos(1));
    }

    // covers: Sq.Corrupt
    #[test]
    fn expired_rows_and_rows_of_another_boot_are_absent() {
        assert_eq!(judge(KEY, None, NOW).unwrap(), Judged::Absent);
        assert_eq!(judge(KEY, Some(&good(1_000)), NOW).unwrap(), Judged::Absent);
        let mut other_boot = good(i64::MAX);
        other_boot[2] = Column::Bytes(b"boot-b".to_vec());
        assert_eq!(judge(KEY, Some(&other_boot), NOW).unwrap(), Judged::Absent);
        // Garbage in an expired row does not matter: it may be overwritten.
        let expired_garbage = row(
            Column::Other,
            Column::Other,
            Column::Bytes(BOOT.into()),
            Column::Integer(0),
        );
        assert_eq!(
            judge(KEY, Some(&expired_garbage), NOW).unwrap(),
            Judged::Absent
        );
    }

    // covers: Sq.Corrupt
    #[test]
    fn unreadable_live_rows_never_match_and_read_as_corrupt() {
        let live = |value, revision| {
            row(
                value,
                revision,
                Column::Bytes(BOOT.into()),
                Column::Integer(i64::MAX),
            )
        };
        for bad in [
            live(Column::Bytes(b"garbage".to_vec()), Column::Integer(5)),
            live(Column::Other, Column::Integer(5)),
            live(Column::Integer(9), Column::Integer(5)),
            live(
                Column::Bytes(lease().value.encode().into_bytes()),
                Column::Integer(-5),
            ),
            live(
                Column::Bytes(lease().value.encode().into_bytes()),
                Column::Integer(0),
            ),
            live(
                Column::Bytes(lease().value.encode().into_bytes()),
                Column::Bytes(b"5".to_vec()),
            ),
        ] {
            let Judged::Live(stored, _) = judge(KEY, Some(&bad), NOW).unwrap() else {
                panic!("{bad:?} judged absent");
            };
            assert_ne!(stored, Stored::expected(&lease()), "{bad:?}");
            assert!(
                matches!(stored.lease(KEY), Err(StoreError::Corrupt { slot: 7, .. })),
                "{bad:?}"
            );
        }
    }

    // covers: Sq.Corrupt
    #[test]
    fn rows_whose_liveness_cannot_be_told_are_corrupt() {
        let mut no_expiry = good(0);
        no_expiry[3] = Column::Bytes(b"soon".to_vec());
        let mut no_boot = good(i64::MAX);
        no_boot[2] = Column::Integer(1);
        for bad in [no_expiry, no_boot] {
            assert!(
                matches!(
                    judge(KEY, Some(&bad), NOW),
                    Err(StoreError::Corrupt { slot: 7, .. })
                ),
                "{bad:?}"
            );
        }
    }

    /// A holding is judged by its session's row, never by its own expiry: live while the session
    /// is (with the session's time left and the holding's own value and revision), absent when
    /// the session expired, is of another boot, or is gone; unreadable session columns are
    /// corrupt.
    // covers: Sq.Sessions, Sq.Corrupt
    #[test]
    fn a_holding_is_judged_by_its_sessions_row() {
        let session = |expires_ns: i64| {
            Owner::Session(Some([
                Column::Bytes(BOOT.into()),
                Column::Integer(expires_ns),
            ]))
        };
        // The holding's own columns say "expired long ago": they are not looked at.
        let holding = good(0);
        let Judged::Live(stored, left) =
            judge_row(KEY, Some((holding.clone(), session(1_250))), NOW).unwrap()
        else {
            panic!("a holding of a live session judged absent");
        };
        assert_eq!(stored, Stored::expected(&lease()));
        assert_eq!(left, Duration::from_nanos(250));
        // Its own columns say "live for ever": the session's say otherwise.
        let forever = good(i64::MAX);
        for owner in [
            session(1_000),
            Owner::Session(Some([
                Column::Bytes(b"boot-b".to_vec()),
                Column::Integer(i64::MAX),
            ])),
            Owner::Session(None),
        ] {
            assert_eq!(
                judge_row(KEY, Some((forever.clone(), owner.clone())), NOW).unwrap(),
                Judged::Absent,
                "{owner:?}"
            );
        }
        // A slot record is judged by its own columns.
        assert!(matches!(
            judge_row(KEY, Some((good(1_001), Owner::Itself)), NOW),
            Ok(Judged::Live(..))
        ));
        assert_eq!(judge_row(KEY, None, NOW).unwrap(), Judged::Absent);
        for owner in [
            Owner::Unreadable,
            Owner::Session(Some([Column::Integer(1), Column::Integer(i64::MAX)])),
        ] {
            assert!(
                matches!(
                    judge_row(KEY, Some((forever.clone(), owner.clone())), NOW),
                    Err(StoreError::Corrupt { slot: 7, .. })
                ),
                "{owner:?}"
            );
        }
        assert_eq!(
            Owner::from_columns(ValueRef::Null, ValueRef::Null, None),
            Owner::Itself
        );
        assert_eq!(
            Owner::from_columns(ValueRef::Integer(1), ValueRef::Integer(2), None),
            Owner::Session(None)
        );
        for (incarnation, id) in [
            (ValueRef::Integer(1), ValueRef::Null),
            (ValueRef::Null, ValueRef::Integer(2)),
            (ValueRef::Text(b"1"), ValueRef::Integer(2)),
        ] {
            assert_eq!(
                Owner::from_columns(incarnation, id, None),
                Owner::Unreadable
            );
        }
    }

    // covers: Sq.Corrupt
    #[test]
    fn expiry_saturates() {
        assert_eq!(expiry_ns(10, Duration::from_nanos(5)), 15);
        assert_eq!(expiry_ns(10, Duration::MAX), i64::MAX);
        assert_eq!(expiry_ns(i64::MAX - 1, Duration::from_secs(1)), i64::MAX);
    }
}

/// Arbitrary rows — any column types, any bytes, any integers — into the row decoder: it never
/// panics, and a row that does not decode never equals the lease a writer expects, so it is never
/// swapped or deleted while it lives.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;
    use vvm_core::Incarnation;

    use super::*;

    const BOOT: &str = "4c1e59a3-0000-4000-8000-000000000001";

    fn column() -> impl Strategy<Value = Column> {
        prop_oneof![
            any::<i64>().prop_map(Column::Integer),
            prop::collection::vec(any::<u8>(), 0..600).prop_map(Column::Bytes),
            // Bytes that look almost right: a real encoding with a few bytes flipped.
            (
                any::<u64>(),
                prop::collection::vec((0usize..64, any::<u8>()), 1..4)
            )
                .prop_map(|(incarnation, flips)| {
                    let value = LeaseValue {
                        address: "10.0.0.1:7000".into(),
                        incarnation: Incarnation(incarnation),
                        stopping: false,
                    };
                    let mut bytes = value.encode().into_bytes();
                    for (at, byte) in flips {
                        let at = at % bytes.len();
                        bytes[at] = byte;
                    }
                    Column::Bytes(bytes)
                }),
            Just(Column::Other),
        ]
    }

    fn boot_id() -> impl Strategy<Value = Column> {
        prop_oneof![Just(Column::Bytes(BOOT.into())), column()]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        // covers: Verify.Decoders, Sq.Corrupt
        #[test]
        fn any_row_is_judged_without_panic_and_a_corrupt_one_never_matches(
            value in column(),
            revision in column(),
            boot_id in boot_id(),
            expires_ns in prop_oneof![any::<i64>().prop_map(Column::Integer), column()],
            now_ns in any::<i64>(),
            incarnation in any::<u64>(),
            expected_revision in 1u64..u64::MAX,
        ) {
            let row: Row = [value, revision, boot_id, expires_ns];
            let now = Now { boot_id: BOOT, ns: now_ns };
            if let Ok(Judged::Live(stored, _)) = judge(Slot(1), Some(&row), now) {
                let expected = Lease {
                    value: LeaseValue::new("10.0.0.1:7000", Incarnation(incarnation)),
                    revision: Revision(expected_revision),
                };
                match stored.lease(Slot(1)) {
                    Ok(lease) => prop_assert_eq!(stored == Stored::expected(&expected), lease == expected),
                    Err(error) => {
                        let is_corrupt = matches!(error, StoreError::Corrupt { .. });
                        prop_assert!(is_corrupt, "{:?}", error);
                        prop_assert!(stored != Stored::expected(&expected));
                    }
                }
            }
        }
    }
}
