//! The lockers a configuration names, made and connected outside the
//! replica's build too: the linearizable ones (PostgreSQL, etcd), and a
//! reader of the last fence a lease key was granted under, which `dlq
//! replay` asks before it repeats an old leader's work.

use guard_std::LastFence;

use crate::config::{Config, Locker};
use crate::error::GatewayError;

/// The PostgreSQL locker `l` names, connected (its table created unless
/// it exists), so a server that cannot be reached stops the start.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres(
    l: &crate::config::PostgresLocker,
) -> Result<guard_postgres::PgLocker, GatewayError> {
    let failed = |source: guard_postgres::PgLockError| GatewayError::LockService {
        kind: "postgres",
        source: Box::new(source),
    };
    let locker = guard_postgres::PgLocker::new(&l.url)
        .and_then(|p| p.with_table(&l.table))
        .and_then(|p| p.with_request_timeout(l.request_timeout))
        .map_err(failed)?;
    locker.connect().await.map_err(failed)?;
    Ok(locker)
}

/// The etcd locker `l` names, checked (a member with a leader answered),
/// so a cluster that cannot be reached stops the start.
#[cfg(feature = "etcd")]
pub(crate) async fn etcd(
    l: &crate::config::EtcdLocker,
) -> Result<guard_etcd::EtcdLocker, GatewayError> {
    let failed = |source: guard_etcd::EtcdError| GatewayError::LockService {
        kind: "etcd",
        source: Box::new(source),
    };
    let config =
        guard_etcd::EtcdConfig::new(l.endpoints.iter().cloned()).with_timeout(l.request_timeout);
    let locker = guard_etcd::EtcdLocker::connect(config)
        .await
        .map_err(failed)?;
    locker.check().await.map_err(failed)?;
    Ok(locker)
}

/// The configured lock service, as a teller of lease keys' last fences.
pub(crate) enum Fences {
    /// Redis: a key's domain's fence counter.
    Redis(Box<guard_redis::RedisLocker>),
    /// PostgreSQL: the key's row, or the fence sequence.
    #[cfg(feature = "postgres")]
    Postgres(Box<guard_postgres::PgLocker>),
    /// etcd: the key's create revision, or the cluster's revision.
    #[cfg(feature = "etcd")]
    Etcd(Box<guard_etcd::EtcdLocker>),
    /// An in-process locker (its fences are another process's) or none:
    /// nothing to ask.
    Unknown,
}

impl Fences {
    /// The lock service `config` names, connected.
    pub(crate) async fn of(config: &Config) -> Result<Fences, GatewayError> {
        Ok(match &config.locker {
            Locker::Redis(l) => Fences::Redis(Box::new(
                l.locker(l.connect().await.map_err(GatewayError::LockerUnreachable)?)
                    .map_err(GatewayError::Locker)?,
            )),
            #[cfg(feature = "postgres")]
            Locker::Postgres(l) => Fences::Postgres(Box::new(postgres(l).await?)),
            #[cfg(feature = "etcd")]
            Locker::Etcd(l) => Fences::Etcd(Box::new(etcd(l).await?)),
            _ => Fences::Unknown,
        })
    }

    /// At least the last fence `key` was granted under (see
    /// [`LastFence`]); `Ok(None)` when the service knows of none, or
    /// cannot be asked (an in-process locker).
    pub(crate) async fn last(&self, key: &str) -> Result<Option<u64>, String> {
        match self {
            Fences::Redis(l) => l.last_fence(key).await.map_err(|e| e.to_string()),
            #[cfg(feature = "postgres")]
            Fences::Postgres(l) => l.last_fence(key).await.map_err(|e| e.to_string()),
            #[cfg(feature = "etcd")]
            Fences::Etcd(l) => l.last_fence(key).await.map_err(|e| e.to_string()),
            Fences::Unknown => Ok(None),
        }
    }
}
