//! How a server is named in errors and logs: never with its password
//! (guard-postgres's rules, shared with its locker).

pub(crate) use guard_postgres::server::{redacted, server_name};
