//! The lease table and the statements on it: the one source of the
//! locker's layout.
//!
//! ```sql
//! CREATE TABLE "<table>" (
//!     key        text        PRIMARY KEY,
//!     token      bytea       NOT NULL,  -- the holder's 16-byte token id
//!     fence      bigint      NOT NULL,  -- from the sequence, never reused
//!     expires_at timestamptz NOT NULL   -- on the server's clock
//! );
//! CREATE SEQUENCE "<table>_fence" AS bigint;
//! CREATE INDEX "<table>_expires" ON "<table>" (expires_at);
//!
//! -- The last grant of each key: the deadline its holder believes, kept
//! -- apart from the lease row so that a row deleted mid-lease grants
//! -- nothing before that deadline.
//! CREATE TABLE "<table>_grants" (
//!     key        text        PRIMARY KEY,
//!     token      bytea       NOT NULL,  -- the last grant's token id
//!     expires_at timestamptz NOT NULL   -- its lease's end, as in the row
//! );
//! CREATE INDEX "<table>_granted" ON "<table>_grants" (expires_at);
//!
//! -- Claim records (guard-core's `claim` module), fences from the same sequence.
//! CREATE TABLE "<table>_claims" (
//!     key         text        PRIMARY KEY,
//!     state       text        NOT NULL,  -- 'r' running, 'f' failed, 'd' done
//!     token       bytea       NOT NULL,  -- the running or last attempt's token id
//!     fence       bigint      NOT NULL,
//!     attempt     integer     NOT NULL,
//!     started     text        NOT NULL,  -- why it started: fresh, failed, expired
//!     lease_until timestamptz,           -- while running, on the server's clock
//!     forget_at   timestamptz NOT NULL,  -- keep after the last write, at least the lease
//!     result      bytea                  -- when done
//! );
//! CREATE INDEX "<table>_forget" ON "<table>_claims" (forget_at);
//!
//! -- Semaphores' permits (guard-core's `semaphore` module), fences from the same sequence.
//! CREATE TABLE "<table>_permits" (
//!     key        text        NOT NULL,
//!     token      bytea       NOT NULL,  -- the holder's 16-byte token id
//!     fence      bigint      NOT NULL,
//!     expires_at timestamptz NOT NULL,  -- on the server's clock
//!     PRIMARY KEY (key, token)
//! );
//! -- Takes a permit of key if fewer than `permits` are live: the fence, or NULL.
//! CREATE FUNCTION "<table>_acquire"(key text, token bytea, permits integer, ms bigint) RETURNS bigint;
//! ```
//!
//! The acquire function counts and inserts under a transaction-level
//! advisory lock named after the semaphore's key, so acquisitions of one
//! key run one after another; under READ COMMITTED (PostgreSQL's default)
//! each statement after the lock sees every permit granted before it.
//! Under a stricter isolation a statement would see the transaction's
//! first snapshot and could count too few, so the function refuses to
//! run there, with an error that says so.
//!
//! A released key's row stays, its lease ended, until a purge after the
//! purge grace (see the acquire statement's comment).
//!
//! # A grant outlives its row
//!
//! Every grant and renewal writes the lease's end to the key's grant
//! record too, in the same statement, and an acquisition is refused while
//! the record's end is ahead, whether the key's lease row is there or not:
//! a row deleted by hand mid-lease grants the key to nobody while its
//! holder may still believe it holds it, and that holder's next renewal,
//! finding no row, tells it so. A release forgets the record (the holder
//! believes nothing any more). **The limit:** a loss of both rows (a
//! restore of an older backup, a failover to a standby that never
//! received them) can grant the key again while its old holder still
//! believes it, until that holder's next renewal.
//!
//! Names are spliced into SQL text (a table cannot be a bind parameter),
//! so only a plain identifier is accepted, and it is always used quoted:
//! nothing a caller passes can end a statement or start another.

/// The lease table, unless another is named.
pub const DEFAULT_TABLE: &str = "guard_locks";

/// PostgreSQL's longest identifier (`NAMEDATALEN - 1`); a longer one is
/// cut silently by the server, so two names could meet.
pub const MAX_IDENTIFIER: usize = 63;

/// Appended to the table's name to name its fence sequence.
const SEQUENCE_SUFFIX: &str = "_fence";

/// Appended to the table's name to name its expiry index (the longest
/// suffix).
const INDEX_SUFFIX: &str = "_expires";

/// Appended to the table's name to name its claim records' table.
const CLAIMS_SUFFIX: &str = "_claims";

/// Appended to the table's name to name the claim records' index.
const CLAIMS_INDEX_SUFFIX: &str = "_forget";

/// Appended to the table's name to name its grant records' table.
const GRANTS_SUFFIX: &str = "_grants";

/// Appended to the table's name to name the grant records' index.
const GRANTS_INDEX_SUFFIX: &str = "_granted";

/// Appended to the table's name to name its permits' table.
const PERMITS_SUFFIX: &str = "_permits";

/// Appended to the table's name to name the permits' acquire function.
const ACQUIRE_SUFFIX: &str = "_acquire";

/// The longest table name: its sequence and index names must fit too.
pub const MAX_TABLE: usize = MAX_IDENTIFIER - INDEX_SUFFIX.len();

/// Why `name` is not a plain identifier of at most `max` bytes, if it is
/// not.
pub fn identifier_rule(name: &str, max: usize) -> Option<String> {
    let mut chars = name.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    (!plain || name.len() > max).then(|| {
        format!(
            "must be a plain SQL identifier: an ASCII letter or '_', then ASCII letters, digits or '_', at most {max} bytes"
        )
    })
}

/// `"name"`: a checked identifier, quoted (so its case is kept).
pub fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

/// The statements of one lease table, built once from its checked name.
///
/// A key's row stays after its release (its lease is ended, not deleted)
/// until a purge long after it ended: the fence of a grant is then drawn
/// where no earlier-drawn fence can follow it (see `acquire`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Statements {
    /// Whether the table exists (`to_regclass`), so that a role without
    /// DDL rights can use a table its DBA created.
    pub(crate) exists: String,
    /// Whether the session's role may use the table and its sequence.
    pub(crate) privileges: String,
    /// Creates the table, its sequence and its index unless they exist,
    /// in one transaction under an advisory lock named after the table,
    /// so replicas starting together do not race on the catalog.
    pub(crate) create: String,
    /// Whether the semaphores' table and function exist: apart from the
    /// locks', so a deployment made before them keeps its locks and
    /// claims when they cannot be made (a role without DDL rights).
    pub(crate) permits_exist: String,
    /// Whether the session's role may use them.
    pub(crate) permit_privileges: String,
    /// Creates them unless they exist, as `create` does.
    pub(crate) create_permits: String,
    /// Grants `$1` (text) to token `$2` (bytea) for `$3` milliseconds
    /// (bigint) if the key is free or its lease has ended, and its last
    /// grant's has too; returns the new fence, or no row if the key is
    /// held (or its last grant may still be believed).
    pub(crate) acquire: String,
    /// Extends `$1`'s lease (and its grant record) to `$4` milliseconds
    /// from now if token `$2` with fence `$3` holds it and its lease has
    /// not ended; one row, the count renewed (1 means renewed).
    pub(crate) renew: String,
    /// Ends `$1`'s lease now if token `$2` with fence `$3` holds it and
    /// the lease has not ended, and forgets the key's grant record if it
    /// is `$2`'s; one row, the count released (1 means released).
    pub(crate) release: String,
    /// Deletes up to `$1` rows whose leases ended more than `$2`
    /// milliseconds ago.
    pub(crate) purge: String,
    /// Deletes up to `$1` grant records whose leases ended more than `$2`
    /// milliseconds ago.
    pub(crate) grants_purge: String,
    /// The last fence granted for `$1`: its row's while the row is kept,
    /// else the sequence's last value (above every fence drawn), NULL when
    /// the sequence never drew one.
    pub(crate) last_fence: String,
    /// Begins an attempt on claim `$1` with token `$2` (bytea), lease
    /// `$3` and keep `$4` milliseconds (bigint). One row: `kind` 1 (an
    /// attempt started: fence, attempt, started), 2 (running: ms left)
    /// or 3 (done: result); no row when the record changed under the
    /// statement (answered as running).
    pub(crate) claim_begin: String,
    /// Extends `$1`'s lease to `$4` ms from now if token `$2` with fence
    /// `$3` runs it and its lease has not ended.
    pub(crate) claim_extend: String,
    /// Settles `$1` as state `$4` (text), kept `$5` ms, with result `$6`
    /// (bytea, or null) if token `$2` with fence `$3` runs it.
    pub(crate) claim_settle: String,
    /// Deletes up to `$1` claim records forgotten more than `$2` ms ago.
    pub(crate) claim_purge: String,
    /// Takes a permit of semaphore `$1` for token `$2` (bytea) if fewer
    /// than `$3` (integer) are live, for `$4` ms (bigint): one row, the
    /// fence, or NULL when the permits are taken.
    pub(crate) permit_acquire: String,
    /// Extends `$1`'s permit of token `$2` with fence `$3` to `$4` ms from
    /// now if it is live; one row affected means renewed.
    pub(crate) permit_renew: String,
    /// Deletes `$1`'s permit of token `$2` with fence `$3` if it is live;
    /// one row affected means released.
    pub(crate) permit_release: String,
    /// The number of live permits of `$1` (bigint).
    pub(crate) permit_holders: String,
    /// Deletes up to `$1` permits whose leases ended more than `$2` ms
    /// ago (an acquisition deletes its key's ended ones; these are of
    /// keys nobody acquires any more).
    pub(crate) permit_purge: String,
}

impl Statements {
    /// The statements on `table`, a name checked by [`identifier_rule`]
    /// with [`MAX_TABLE`].
    pub(crate) fn new(table: &str) -> Self {
        let t = quoted(table);
        let sequence = quoted(&format!("{table}{SEQUENCE_SUFFIX}"));
        let index = quoted(&format!("{table}{INDEX_SUFFIX}"));
        let c = quoted(&format!("{table}{CLAIMS_SUFFIX}"));
        let claims_index = quoted(&format!("{table}{CLAIMS_INDEX_SUFFIX}"));
        let g = quoted(&format!("{table}{GRANTS_SUFFIX}"));
        let grants_index = quoted(&format!("{table}{GRANTS_INDEX_SUFFIX}"));
        let p = quoted(&format!("{table}{PERMITS_SUFFIX}"));
        let acquire_fn = quoted(&format!("{table}{ACQUIRE_SUFFIX}"));
        // A lease's end: the server's clock plus the TTL. `clock_timestamp`
        // rather than `now`: the instant it is evaluated, not the
        // statement's transaction's start.
        let until =
            |param: &str| format!("clock_timestamp() + {param}::bigint * interval '1 millisecond'");
        Statements {
            exists: format!(
                "SELECT to_regclass('{t}') IS NOT NULL AND to_regclass('{c}') IS NOT NULL \
                 AND to_regclass('{g}') IS NOT NULL"
            ),
            privileges: format!(
                "SELECT has_table_privilege('{t}', 'SELECT, INSERT, UPDATE, DELETE') \
                 AND has_table_privilege('{c}', 'SELECT, INSERT, UPDATE, DELETE') \
                 AND has_table_privilege('{g}', 'SELECT, INSERT, UPDATE, DELETE') \
                 AND has_sequence_privilege('{sequence}', 'USAGE')"
            ),
            permits_exist: format!(
                "SELECT to_regclass('{p}') IS NOT NULL \
                 AND to_regprocedure('{acquire_fn}(text, bytea, integer, bigint)') IS NOT NULL"
            ),
            permit_privileges: format!(
                "SELECT has_table_privilege('{p}', 'SELECT, INSERT, UPDATE, DELETE') \
                 AND has_function_privilege('{acquire_fn}(text, bytea, integer, bigint)', 'EXECUTE')"
            ),
            create: format!(
                "BEGIN; \
                 SELECT pg_advisory_xact_lock(hashtext('guard-postgres {table}')); \
                 CREATE TABLE IF NOT EXISTS {t} (\
                 key text PRIMARY KEY, \
                 token bytea NOT NULL, \
                 fence bigint NOT NULL, \
                 expires_at timestamptz NOT NULL); \
                 CREATE SEQUENCE IF NOT EXISTS {sequence} AS bigint; \
                 CREATE INDEX IF NOT EXISTS {index} ON {t} (expires_at); \
                 CREATE TABLE IF NOT EXISTS {c} (\
                 key text PRIMARY KEY, \
                 state text NOT NULL, \
                 token bytea NOT NULL, \
                 fence bigint NOT NULL, \
                 attempt integer NOT NULL, \
                 started text NOT NULL, \
                 lease_until timestamptz, \
                 forget_at timestamptz NOT NULL, \
                 result bytea); \
                 CREATE INDEX IF NOT EXISTS {claims_index} ON {c} (forget_at); \
                 CREATE TABLE IF NOT EXISTS {g} (\
                 key text PRIMARY KEY, \
                 token bytea NOT NULL, \
                 expires_at timestamptz NOT NULL); \
                 CREATE INDEX IF NOT EXISTS {grants_index} ON {g} (expires_at); \
                 COMMIT"
            ),
            create_permits: format!(
                "BEGIN; \
                 SELECT pg_advisory_xact_lock(hashtext('guard-postgres {table}')); \
                 CREATE TABLE IF NOT EXISTS {p} (\
                 key text NOT NULL, \
                 token bytea NOT NULL, \
                 fence bigint NOT NULL, \
                 expires_at timestamptz NOT NULL, \
                 PRIMARY KEY (key, token)); \
                 CREATE OR REPLACE FUNCTION {acquire_fn}(k text, tok bytea, permits integer, ms bigint) \
                 RETURNS bigint LANGUAGE plpgsql VOLATILE AS $guard$ \
                 DECLARE live integer; f bigint; \
                 BEGIN \
                 IF current_setting('transaction_isolation') <> 'read committed' THEN \
                 RAISE EXCEPTION 'guard: {table}{ACQUIRE_SUFFIX} takes a permit only under READ COMMITTED isolation; this session runs %: set default_transaction_isolation to read committed for its role', \
                 current_setting('transaction_isolation'); \
                 END IF; \
                 PERFORM pg_advisory_xact_lock(hashtextextended('guard-postgres {table} ' || k, 0)); \
                 DELETE FROM {p} WHERE key = k AND expires_at <= clock_timestamp(); \
                 SELECT count(*) INTO live FROM {p} WHERE key = k; \
                 IF live >= permits THEN RETURN NULL; END IF; \
                 f := nextval('{sequence}'); \
                 INSERT INTO {p} (key, token, fence, expires_at) VALUES (k, tok, f, {fn_until}); \
                 RETURN f; \
                 END $guard$; \
                 COMMIT",
                fn_until = until("ms"),
            ),
            // One statement. Contenders for one key wait on each other's
            // row lock, and the second sees the first's live lease in the
            // WHERE and takes nothing. The fence and the lease's end of a
            // taken row are evaluated in the SET, after its row lock is
            // held: greater than every fence drawn before. A new row's
            // come from VALUES, drawn before the insert; no fence drawn
            // later can be in the table before it, because a key's row is
            // only deleted by a purge long after its lease ended (longer
            // than any statement may run: the session's
            // `statement_timeout`).
            //
            // A live grant record refuses the grant even without a row
            // (one deleted by hand): nothing is inserted, so no row is
            // returned. The record is written in the same statement as
            // the row it follows.
            acquire: format!(
                "WITH granted AS (\
                 INSERT INTO {t} AS held (key, token, fence, expires_at) \
                 SELECT $1::text, $2::bytea, nextval('{sequence}'), {values_until} \
                 WHERE NOT EXISTS (SELECT 1 FROM {g} WHERE key = $1 AND expires_at > clock_timestamp()) \
                 ON CONFLICT (key) DO UPDATE \
                 SET token = excluded.token, fence = nextval('{sequence}'), expires_at = {set_until} \
                 WHERE held.expires_at <= clock_timestamp() \
                 RETURNING key, token, fence, expires_at), \
                 recorded AS (\
                 INSERT INTO {g} (key, token, expires_at) SELECT key, token, expires_at FROM granted \
                 ON CONFLICT (key) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at) \
                 SELECT fence FROM granted",
                values_until = until("$3"),
                set_until = until("$3"),
            ),
            renew: format!(
                "WITH renewed AS (\
                 UPDATE {t} SET expires_at = {} \
                 WHERE key = $1 AND token = $2 AND fence = $3 AND expires_at > clock_timestamp() \
                 RETURNING key, token, expires_at), \
                 recorded AS (\
                 INSERT INTO {g} (key, token, expires_at) SELECT key, token, expires_at FROM renewed \
                 ON CONFLICT (key) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at) \
                 SELECT count(*) FROM renewed",
                until("$4")
            ),
            // The record is forgotten when it is this token's, whether the
            // row is there or not: a holder that gives its grant up no
            // longer believes it, even one whose row was deleted.
            release: format!(
                "WITH released AS (\
                 UPDATE {t} SET expires_at = clock_timestamp() \
                 WHERE key = $1 AND token = $2 AND fence = $3 AND expires_at > clock_timestamp() \
                 RETURNING key), \
                 forgotten AS (DELETE FROM {g} WHERE key = $1 AND token = $2) \
                 SELECT count(*) FROM released"
            ),
            last_fence: format!(
                "SELECT COALESCE((SELECT fence FROM {t} WHERE key = $1), \
                 pg_sequence_last_value('{sequence}'::regclass))"
            ),
            grants_purge: format!(
                "DELETE FROM {g} WHERE key IN (\
                 SELECT key FROM {g} \
                 WHERE expires_at <= clock_timestamp() - $2::bigint * interval '1 millisecond' \
                 ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE key IN (\
                 SELECT key FROM {t} \
                 WHERE expires_at <= clock_timestamp() - $2::bigint * interval '1 millisecond' \
                 ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
            // One statement, as the acquire: contenders wait on the
            // record's row lock and the second finds a running lease. A
            // record that did not start an attempt is read in the
            // statement's snapshot, which may predate a write the upsert
            // saw: it can only answer Running where the truth is a newer
            // state (a retry later finds it), never Done where the work
            // is not (a done record stays done until it is forgotten).
            claim_begin: format!(
                "WITH up AS (\
                 INSERT INTO {c} AS held (key, state, token, fence, attempt, started, lease_until, forget_at, result) \
                 VALUES ($1, 'r', $2, nextval('{sequence}'), 1, 'fresh', {lease}, {forget}, NULL) \
                 ON CONFLICT (key) DO UPDATE SET \
                 state = 'r', token = excluded.token, fence = nextval('{sequence}'), \
                 attempt = CASE WHEN held.forget_at <= clock_timestamp() THEN 1 ELSE held.attempt + 1 END, \
                 started = CASE WHEN held.forget_at <= clock_timestamp() THEN 'fresh' \
                 WHEN held.state = 'f' THEN 'failed' ELSE 'expired' END, \
                 lease_until = {lease}, forget_at = {forget}, result = NULL \
                 WHERE held.forget_at <= clock_timestamp() OR held.state = 'f' \
                 OR (held.state = 'r' AND held.lease_until <= clock_timestamp()) \
                 RETURNING fence, attempt, started) \
                 SELECT 1 AS kind, fence, attempt, started, NULL::bigint AS left_ms, NULL::bytea AS result FROM up \
                 UNION ALL \
                 SELECT CASE WHEN state = 'd' THEN 3 ELSE 2 END, NULL, NULL, NULL, \
                 GREATEST(0, CEIL(EXTRACT(EPOCH FROM (lease_until - clock_timestamp())) * 1000))::bigint, result \
                 FROM {c} WHERE key = $1 AND forget_at > clock_timestamp() AND NOT EXISTS (SELECT 1 FROM up)",
                lease = until("$3"),
                forget = until("GREATEST($3::bigint, $4::bigint)"),
            ),
            claim_extend: format!(
                "UPDATE {c} SET lease_until = {lease}, forget_at = GREATEST(forget_at, {lease}) \
                 WHERE key = $1 AND token = $2 AND fence = $3 AND state = 'r' \
                 AND lease_until > clock_timestamp()",
                lease = until("$4"),
            ),
            claim_settle: format!(
                "UPDATE {c} SET state = $4, lease_until = NULL, forget_at = {}, result = $6 \
                 WHERE key = $1 AND token = $2 AND fence = $3 AND state = 'r' \
                 AND forget_at > clock_timestamp()",
                until("$5"),
            ),
            claim_purge: format!(
                "DELETE FROM {c} WHERE key IN (\
                 SELECT key FROM {c} \
                 WHERE forget_at <= clock_timestamp() - $2::bigint * interval '1 millisecond' \
                 ORDER BY forget_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
            permit_acquire: format!("SELECT {acquire_fn}($1, $2, $3, $4)"),
            permit_renew: format!(
                "UPDATE {p} SET expires_at = {} \
                 WHERE key = $1 AND token = $2 AND fence = $3 AND expires_at > clock_timestamp()",
                until("$4")
            ),
            permit_release: format!(
                "DELETE FROM {p} \
                 WHERE key = $1 AND token = $2 AND fence = $3 AND expires_at > clock_timestamp()"
            ),
            permit_holders: format!(
                "SELECT count(*) FROM {p} WHERE key = $1 AND expires_at > clock_timestamp()"
            ),
            permit_purge: format!(
                "DELETE FROM {p} WHERE (key, token) IN (\
                 SELECT key, token FROM {p} \
                 WHERE expires_at <= clock_timestamp() - $2::bigint * interval '1 millisecond' \
                 LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_that_leave_room_for_the_suffixes_are_names() {
        assert_eq!(identifier_rule("guard_locks", MAX_TABLE), None);
        assert_eq!(identifier_rule("_Locks2", MAX_TABLE), None);
        for bad in ["", "2locks", "locks; drop table x", "lock\"s", "über"] {
            assert!(identifier_rule(bad, MAX_TABLE).is_some(), "{bad:?}");
        }
        let longest = "a".repeat(MAX_TABLE);
        assert_eq!(identifier_rule(&longest, MAX_TABLE), None);
        assert!(identifier_rule(&format!("{longest}a"), MAX_TABLE).is_some());
        for suffix in [
            INDEX_SUFFIX,
            SEQUENCE_SUFFIX,
            CLAIMS_SUFFIX,
            CLAIMS_INDEX_SUFFIX,
            GRANTS_SUFFIX,
            GRANTS_INDEX_SUFFIX,
            PERMITS_SUFFIX,
            ACQUIRE_SUFFIX,
        ] {
            assert!(
                format!("{longest}{suffix}").len() <= MAX_IDENTIFIER,
                "{suffix}"
            );
        }
    }

    #[test]
    fn statements_quote_the_names_and_compare_token_and_fence() {
        let s = Statements::new("Locks");
        assert!(s.create.contains("CREATE TABLE IF NOT EXISTS \"Locks\" ("));
        assert!(
            s.create
                .contains("CREATE SEQUENCE IF NOT EXISTS \"Locks_fence\"")
        );
        assert!(s.acquire.contains("nextval('\"Locks_fence\"')"));
        assert!(
            s.acquire
                .contains("WHERE held.expires_at <= clock_timestamp()")
        );
        assert!(s.renew.contains("token = $2 AND fence = $3"));
        assert!(s.renew.contains("$4::bigint"));
        assert!(s.release.contains("token = $2 AND fence = $3"));
        assert!(
            s.acquire
                .contains("SET token = excluded.token, fence = nextval('\"Locks_fence\"')"),
            "a taken row's fence is drawn under its row lock: {}",
            s.acquire
        );
        assert!(s.exists.contains("to_regclass('\"Locks\"')"));
        assert!(s.purge.contains("FOR UPDATE SKIP LOCKED"));
    }
}
