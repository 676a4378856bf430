//! The store's schema: created on first use, versioned, checked on every open.
//!
//! `<schema>.vvm_meta (name text primary key, value text)` holds the row `('version', '1')`;
//! `<schema>.vvm_kv (key bytea primary key, value bytea not null)` holds the keys, with a
//! trigger that notifies every change on channel `vvm.<schema>`. A schema whose tables exist
//! without that version row is someone else's and is refused; a newer version is refused.

use std::sync::Arc;

use tokio_postgres::error::SqlState;

use super::{PgOpenError, Shared};

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i64 = 1;
/// Keys longer than this are notified with an empty payload (wakes every watch): a payload
/// holds at most 8000 bytes, and hex doubles the key.
const PAYLOAD_KEY_MAX_BYTES: usize = 3900;

/// The statements of the store, for one schema.
pub(super) struct Sql {
    schema: String,
    pub(super) get: String,
    pub(super) range: String,
    pub(super) put: String,
    pub(super) delete: String,
}

impl Sql {
    /// `schema` is a checked plain identifier (see `PgConfig::schema`): nothing to quote.
    pub(super) fn new(schema: &str) -> Sql {
        Sql {
            schema: schema.to_owned(),
            get: format!("SELECT value FROM {schema}.vvm_kv WHERE key = $1"),
            range: format!(
                "SELECT key, value FROM {schema}.vvm_kv WHERE key >= $1 AND key < $2 ORDER BY key LIMIT $3"
            ),
            put: format!(
                "INSERT INTO {schema}.vvm_kv (key, value) VALUES ($1, $2) \
                 ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
            ),
            delete: format!("DELETE FROM {schema}.vvm_kv WHERE key = $1"),
        }
    }

    fn create(&self) -> String {
        let schema = &self.schema;
        format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE {schema}.vvm_meta (name text PRIMARY KEY, value text NOT NULL);
             CREATE TABLE {schema}.vvm_kv (key bytea PRIMARY KEY, value bytea NOT NULL);
             CREATE FUNCTION {schema}.vvm_notify() RETURNS trigger LANGUAGE plpgsql AS $f$
             DECLARE changed bytea;
             BEGIN
               IF TG_OP = 'DELETE' THEN changed := OLD.key; ELSE changed := NEW.key; END IF;
               PERFORM pg_notify('vvm.{schema}', CASE WHEN octet_length(changed) <= {PAYLOAD_KEY_MAX_BYTES}
                 THEN encode(changed, 'hex') ELSE '' END);
               RETURN NULL;
             END $f$;
             CREATE TRIGGER vvm_notify AFTER INSERT OR UPDATE OR DELETE ON {schema}.vvm_kv
               FOR EACH ROW EXECUTE FUNCTION {schema}.vvm_notify();
             INSERT INTO {schema}.vvm_meta VALUES ('version', '{SCHEMA_VERSION}');"
        )
    }
}

/// What the schema holds now.
enum Found {
    Nothing,
    Version(Option<String>),
    /// A table named `vvm_kv` without the meta table.
    KvOnly,
}

async fn look(
    client: &tokio_postgres::Client,
    schema: &str,
) -> Result<Found, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT to_regclass($1)::text, to_regclass($2)::text",
            &[&format!("{schema}.vvm_meta"), &format!("{schema}.vvm_kv")],
        )
        .await?;
    let (meta, kv): (Option<String>, Option<String>) = (row.try_get(0)?, row.try_get(1)?);
    match (meta, kv) {
        (None, None) => Ok(Found::Nothing),
        (None, Some(_)) => Ok(Found::KvOnly),
        (Some(_), _) => {
            let version = client
                .query_opt(
                    &format!("SELECT value FROM {schema}.vvm_meta WHERE name = 'version'"),
                    &[],
                )
                .await?;
            // A value column of another type is someone else's table: no version then.
            Ok(Found::Version(
                version.and_then(|row| row.try_get::<_, String>(0).ok()),
            ))
        }
    }
}

/// Creates the schema if it is absent (with `write`; without, an absent schema is
/// [`PgOpenError::NoStore`] and nothing is written), then checks its version and the user's
/// rights (without `write`, to read only), on a connection of its own (the pooled ones prepare
/// statements on the table it may create).
pub(super) async fn ensure(shared: &Arc<Shared>, write: bool) -> Result<(), PgOpenError> {
    let config = &shared.config;
    let schema = config.schema.as_str();
    // Its connection ends when `client` is dropped at the end of this function.
    let client = super::connect_client(&shared.driver, &shared.connector)
        .await
        .map_err(|source| PgOpenError::Connect {
            target: config.target(),
            source,
        })?;
    let setup = |source: tokio_postgres::Error| -> PgOpenError {
        if source.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
            PgOpenError::Privilege {
                user: config.user.clone(),
                needed: format!(
                    "USAGE on schema {schema}, or CREATE on database {} to create it and its tables",
                    config.dbname
                ),
            }
        } else {
            PgOpenError::Setup {
                schema: schema.to_owned(),
                source,
            }
        }
    };
    let mut found = look(&client, schema).await.map_err(setup)?;
    if matches!(found, Found::Nothing) && !write {
        return Err(PgOpenError::NoStore {
            schema: schema.to_owned(),
            dbname: config.dbname.clone(),
        });
    }
    if matches!(found, Found::Nothing) {
        // One creator at a time (the lock ends with the transaction); the others find it made.
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('vvm schema {schema}'))"
            ))
            .await
            .map_err(setup)?;
        found = look(&client, schema).await.map_err(setup)?;
        if matches!(found, Found::Nothing) {
            client
                .batch_execute(&shared.sql.create())
                .await
                .map_err(setup)?;
            found = Found::Version(Some(SCHEMA_VERSION.to_string()));
        }
        client.batch_execute("COMMIT").await.map_err(setup)?;
    }
    let foreign = |reason| PgOpenError::ForeignSchema {
        schema: schema.to_owned(),
        reason,
    };
    let version = match found {
        Found::KvOnly => return Err(foreign("it holds a table vvm_kv without vvm_meta")),
        Found::Version(None) | Found::Nothing => {
            return Err(foreign("vvm_meta has no version row"))
        }
        Found::Version(Some(text)) => text.parse::<i64>(),
    };
    match version {
        Ok(SCHEMA_VERSION) => {}
        Ok(found) if found > SCHEMA_VERSION => {
            return Err(PgOpenError::NewerSchema {
                schema: schema.to_owned(),
                found,
                known: SCHEMA_VERSION,
            })
        }
        _ => return Err(foreign("its version row is not one vvm wrote")),
    }
    let table = format!("{schema}.vvm_kv");
    let needed: &[&str] = if write {
        &["SELECT", "INSERT", "UPDATE", "DELETE"]
    } else {
        &["SELECT"]
    };
    let missing = client
        .query(
            "SELECT p FROM unnest($3::text[]) AS p \
             WHERE NOT has_schema_privilege($1, 'USAGE') OR NOT has_table_privilege($2, p)",
            &[&schema, &table, &needed],
        )
        .await
        .map_err(setup)?;
    if !missing.is_empty() {
        let rights: Vec<String> = missing
            .iter()
            .filter_map(|row| row.try_get(0).ok())
            .collect();
        return Err(PgOpenError::Privilege {
            user: config.user.clone(),
            needed: format!(
                "{} on {table} (and USAGE on schema {schema})",
                rights.join(", ")
            ),
        });
    }
    Ok(())
}
