//! Table names and the statements built from them.
//!
//! Names are spliced into SQL text (a table cannot be a bind parameter),
//! so only a plain identifier is accepted, and it is always used quoted:
//! nothing a caller passes can end a statement or start another.

use guard_postgres::sql::quoted;
pub(crate) use guard_postgres::sql::{MAX_IDENTIFIER, identifier_rule};

/// Appended to a queue's table to name its default dead-letter table.
pub(crate) const DEAD_LETTER_SUFFIX: &str = "_dead_letters";

/// The longest queue table: its default dead-letter table must fit too.
pub(crate) const MAX_TABLE: usize = MAX_IDENTIFIER - DEAD_LETTER_SUFFIX.len();

/// The statements of one queue, built once from its checked names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Statements {
    /// Claims up to `$1` rows for consumer `$2` for `$3` microseconds;
    /// returns id, payload, deliveries, enqueued_at, claim_token.
    pub(crate) claim: String,
    /// Deletes row `$1` if its claim token is still `$2`.
    pub(crate) complete: String,
    /// Moves row `$1`, if its claim token is still `$2`, to the
    /// dead-letter table with origin table `$3`, error `$4` and attempts
    /// `$5`: one statement, so one transaction.
    pub(crate) dead_letter: String,
    /// Inserts one row with payload `$1`; returns its id.
    pub(crate) push: String,
    /// Inserts a row per payload of the array `$1`, in array order;
    /// returns their ids.
    pub(crate) push_batch: String,
    /// Creates both tables unless they exist.
    pub(crate) create: String,
}

impl Statements {
    /// The statements of queue `table` with dead letters in
    /// `dead_letters` (both checked by [`identifier_rule`]).
    pub(crate) fn new(table: &str, dead_letters: &str) -> Self {
        let t = quoted(table);
        let dl = quoted(dead_letters);
        // The row lock (FOR UPDATE SKIP LOCKED) keeps two claimers off one
        // row while both decide; claimed_until keeps the next ones off it
        // once the claim is committed: READ COMMITTED re-checks the WHERE
        // on the newest version of a row it locks, so a row claimed by a
        // transaction that committed meanwhile is left out. Times are the
        // server's (now() is the transaction's start), so replicas'
        // clocks do not matter. txid_current() is unique per claiming
        // transaction and grows, so a row's newer claim has a greater
        // token than any older one.
        let claim = format!(
            "WITH c AS (\
                SELECT id FROM {t} \
                WHERE available_at <= now() \
                AND (claimed_until IS NULL OR claimed_until < now()) \
                ORDER BY id LIMIT $1 \
                FOR UPDATE SKIP LOCKED\
            ) \
            UPDATE {t} AS q SET \
                claimed_by = $2, \
                claim_token = txid_current(), \
                claimed_until = now() + $3::bigint * interval '1 microsecond', \
                deliveries = q.deliveries + 1 \
            FROM c WHERE q.id = c.id \
            RETURNING q.id, q.payload, q.deliveries, q.enqueued_at, q.claim_token"
        );
        let complete = format!("DELETE FROM {t} WHERE id = $1 AND claim_token = $2");
        let dead_letter = format!(
            "WITH d AS (\
                DELETE FROM {t} WHERE id = $1 AND claim_token = $2 \
                RETURNING id, payload, deliveries, enqueued_at\
            ) \
            INSERT INTO {dl} \
                (origin_table, origin_id, payload, error, attempts, deliveries, enqueued_at, failed_at) \
            SELECT $3::text, d.id, d.payload, $4::text, $5::integer, d.deliveries, d.enqueued_at, now() FROM d"
        );
        let push = format!("INSERT INTO {t} (payload) VALUES ($1) RETURNING id");
        // Rows are inserted in array order, and each takes its id from the
        // sequence as it is inserted: ids grow in array order.
        let push_batch = format!(
            "INSERT INTO {t} (payload) \
            SELECT p FROM unnest($1::bytea[]) WITH ORDINALITY AS u(p, n) ORDER BY n \
            RETURNING id"
        );
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {t} (\
                id BIGSERIAL PRIMARY KEY, \
                payload BYTEA NOT NULL, \
                enqueued_at TIMESTAMPTZ NOT NULL DEFAULT now(), \
                available_at TIMESTAMPTZ NOT NULL DEFAULT now(), \
                deliveries INTEGER NOT NULL DEFAULT 0, \
                claimed_by TEXT, \
                claim_token BIGINT, \
                claimed_until TIMESTAMPTZ\
            ); \
            CREATE TABLE IF NOT EXISTS {dl} (\
                id BIGSERIAL PRIMARY KEY, \
                origin_table TEXT NOT NULL, \
                origin_id BIGINT NOT NULL, \
                payload BYTEA NOT NULL, \
                error TEXT NOT NULL, \
                attempts INTEGER NOT NULL, \
                deliveries INTEGER NOT NULL, \
                enqueued_at TIMESTAMPTZ, \
                failed_at TIMESTAMPTZ NOT NULL DEFAULT now()\
            )"
        );
        Statements {
            claim,
            complete,
            dead_letter,
            push,
            push_batch,
            create,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_identifiers_pass() {
        for name in ["jobs", "_jobs", "Jobs_2", "a"] {
            assert_eq!(identifier_rule(name, MAX_IDENTIFIER), None, "{name}");
        }
        let longest = "a".repeat(MAX_IDENTIFIER);
        assert_eq!(identifier_rule(&longest, MAX_IDENTIFIER), None);
    }

    #[test]
    fn anything_else_is_refused() {
        for name in [
            "",
            "a; drop table x",
            "2jobs",
            "jobs\"",
            "public.jobs",
            "jöbs",
            "jobs ",
            "a-b",
        ] {
            assert!(identifier_rule(name, MAX_IDENTIFIER).is_some(), "{name:?}");
        }
        let long = "a".repeat(MAX_IDENTIFIER + 1);
        let rule = identifier_rule(&long, MAX_IDENTIFIER).expect("too long");
        assert!(rule.contains("at most 63 bytes"), "{rule}");
    }

    #[test]
    fn a_table_leaves_room_for_its_dead_letter_table() {
        let table = "t".repeat(MAX_TABLE);
        let dead_letters = format!("{table}{DEAD_LETTER_SUFFIX}");
        assert_eq!(identifier_rule(&dead_letters, MAX_IDENTIFIER), None);
    }

    #[test]
    fn statements_use_the_names_quoted_and_check_the_token() {
        let s = Statements::new("Jobs", "Jobs_dl");
        assert!(s.claim.contains("FROM \"Jobs\" WHERE"), "{}", s.claim);
        assert!(s.claim.contains("FOR UPDATE SKIP LOCKED"), "{}", s.claim);
        assert!(s.complete.ends_with("claim_token = $2"), "{}", s.complete);
        assert!(
            s.dead_letter.contains("claim_token = $2"),
            "{}",
            s.dead_letter
        );
        assert!(
            s.dead_letter.contains("INSERT INTO \"Jobs_dl\""),
            "{}",
            s.dead_letter
        );
        assert!(s.create.contains("\"Jobs_dl\""), "{}", s.create);
    }
}
