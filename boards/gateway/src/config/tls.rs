//! The TLS keys of a connection (`tls_ca`, `tls_cert`, `tls_key`): the
//! files read and checked once, when the configuration is loaded, so a
//! missing file or a PEM without a certificate is an error naming its key
//! and not a failure at the first connection.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{ConfigError, invalid};

/// The TLS settings of one connection, from its `tls_ca`, `tls_cert` and
/// `tls_key` keys: the CA certificates to trust instead of the system's
/// roots, and a client certificate with its key for servers that require
/// one. Without files, the system's roots and no client certificate.
///
/// Only a configuration builds one (with the `tls` feature), after
/// reading and checking the files. Cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsFiles(Arc<Files>);

#[derive(PartialEq, Eq)]
struct Files {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    #[cfg(feature = "tls")]
    redis: guard_redis::RedisTls,
    #[cfg(feature = "tls")]
    mqtt: guard_endpoints::mqtt::MqttTls,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The paths only: never a key's content.
        f.debug_struct("TlsFiles")
            .field("ca", &self.0.ca)
            .field("cert", &self.0.cert)
            .field("key", &self.0.key)
            .finish()
    }
}

impl TlsFiles {
    /// `tls_ca`: the CA certificates' file, if given.
    pub fn ca_path(&self) -> Option<&Path> {
        self.0.ca.as_deref()
    }

    /// `tls_cert`: the client certificate's file, if given.
    pub fn cert_path(&self) -> Option<&Path> {
        self.0.cert.as_deref()
    }

    /// `tls_key`: the client key's file, if given.
    pub fn key_path(&self) -> Option<&Path> {
        self.0.key.as_deref()
    }

    /// The settings for a Redis connection.
    #[cfg(feature = "tls")]
    pub fn redis(&self) -> &guard_redis::RedisTls {
        &self.0.redis
    }

    /// The settings for an MQTT connection.
    #[cfg(feature = "tls")]
    pub fn mqtt(&self) -> &guard_endpoints::mqtt::MqttTls {
        &self.0.mqtt
    }
}

/// A connection's TLS keys as written (paths, with `${NAME}` not yet
/// expanded).
pub(crate) struct TlsKeys<'a> {
    pub ca: &'a Option<String>,
    pub cert: &'a Option<String>,
    pub key: &'a Option<String>,
}

impl TlsKeys<'_> {
    /// The first key set, with its value: for errors about them all.
    pub fn first(&self) -> Option<(&'static str, &str)> {
        [
            ("tls_ca", self.ca),
            ("tls_cert", self.cert),
            ("tls_key", self.key),
        ]
        .into_iter()
        .find_map(|(name, value)| value.as_deref().map(|v| (name, v)))
    }
}

/// What a build without TLS support says of a TLS setting.
#[cfg(not(feature = "tls"))]
const NO_TLS: &str =
    "no TLS setting: this build has no TLS support (the gateway's `tls` feature, on by default)";

/// Reads and checks the files `keys` name (`key(field)` is a field's
/// dotted key; `expand` resolves `${NAME}` in a path): the settings of a
/// TLS connection (with no files: the system's roots). Without TLS
/// support, an error naming the first key set (or `tls`).
#[cfg(not(feature = "tls"))]
pub(crate) fn read(
    keys: &TlsKeys<'_>,
    key: &dyn Fn(&str) -> String,
    _expand: &dyn Fn(&str, &str) -> Result<String, ConfigError>,
) -> Result<TlsFiles, ConfigError> {
    let (field, value) = keys
        .first()
        .map_or(("tls", "true".to_owned()), |(field, value)| {
            (field, format!("{value:?}"))
        });
    Err(invalid(key(field), value, NO_TLS))
}

/// Reads and checks the files `keys` name (`key(field)` is a field's
/// dotted key; `expand` resolves `${NAME}` in a path): the settings of a
/// TLS connection (with no files: the system's roots).
#[cfg(feature = "tls")]
pub(crate) fn read(
    keys: &TlsKeys<'_>,
    key: &dyn Fn(&str) -> String,
    expand: &dyn Fn(&str, &str) -> Result<String, ConfigError>,
) -> Result<TlsFiles, ConfigError> {
    use guard_redis::{Parameter, RedisGuardError, RedisTls};

    use guard_endpoints::mqtt::MqttTls;

    match (keys.cert, keys.key) {
        (Some(_), None) => {
            return Err(invalid(
                key("tls_key"),
                "missing",
                "the PEM private key of `tls_cert` (a client certificate needs both)",
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                key("tls_cert"),
                "missing",
                "the PEM client certificate of `tls_key` (a client certificate needs both)",
            ));
        }
        _ => {}
    }
    let file = |field: &str, value: &Option<String>, what: &str| {
        let Some(value) = value else {
            return Ok(None);
        };
        let path = expand(&key(field), value)?;
        if path.is_empty() {
            return Err(invalid(key(field), "\"\"", format!("the path of {what}")));
        }
        let bytes = std::fs::read(&path).map_err(|e| {
            invalid(
                key(field),
                format!("{value:?}"),
                format!("a readable file of {what} ({e})"),
            )
        })?;
        Ok(Some((PathBuf::from(path), bytes)))
    };
    const CA: &str = "PEM CA certificates";
    const CERT: &str = "a PEM client certificate";
    const KEY: &str = "the PEM private key of the client certificate";
    let ca = file("tls_ca", keys.ca, CA)?;
    let cert = file("tls_cert", keys.cert, CERT)?;
    let client_key = file("tls_key", keys.key, KEY)?;

    // guard-redis's check names the parameter; the error names the key,
    // the file as written and what the file must hold.
    let refused = |e: RedisGuardError| {
        let (field, value, what) = match &e {
            RedisGuardError::InvalidInput {
                parameter: Parameter::TlsClientCert,
                ..
            } => ("tls_cert", keys.cert, CERT),
            RedisGuardError::InvalidInput {
                parameter: Parameter::TlsClientKey,
                ..
            } => ("tls_key", keys.key, KEY),
            _ => ("tls_ca", keys.ca, CA),
        };
        let rule = match &e {
            RedisGuardError::InvalidInput { rule, .. } => rule.clone(),
            other => other.to_string(),
        };
        let value = value.as_deref().unwrap_or_default();
        invalid(key(field), format!("{value:?}"), format!("{what}: {rule}"))
    };
    let mut redis = RedisTls::new();
    let mut mqtt = MqttTls::new();
    if let Some((_, pem)) = &ca {
        redis = redis.with_root_ca(pem.clone()).map_err(refused)?;
        // The same checks as guard-redis's: what passed them passes here.
        mqtt = mqtt
            .with_root_ca(pem.clone())
            .map_err(|e| invalid(key("tls_ca"), "set", format!("{CA}: {e}")))?;
    }
    if let (Some((_, cert_pem)), Some((_, key_pem))) = (&cert, &client_key) {
        redis = redis
            .with_client_identity(cert_pem.clone(), key_pem.clone())
            .map_err(refused)?;
        mqtt = mqtt
            .with_client_identity(cert_pem.clone(), key_pem.clone())
            .map_err(|e| invalid(key("tls_cert"), "set", format!("{CERT}: {e}")))?;
    }
    Ok(TlsFiles(Arc::new(Files {
        ca: ca.map(|(path, _)| path),
        cert: cert.map(|(path, _)| path),
        key: client_key.map(|(path, _)| path),
        redis,
        mqtt,
    })))
}
