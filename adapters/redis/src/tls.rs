//! TLS for `rediss://` deployments (the `tls` feature): which certificate
//! authorities a connection trusts and, for servers that ask for one, the
//! client certificate it presents.
//!
//! The certificates are checked when they are given (a PEM file that
//! holds no certificate, a key that is not the certificate's, is an error
//! here, not at the first connection), and the same settings serve every
//! topology: a standalone server, the sentinels and the masters they name,
//! every node of a cluster.

use std::fmt;
use std::sync::Arc;

use redis::cluster::ClusterClientBuilder;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ClientTlsConfig, IntoConnectionInfo, TlsCertificates, TlsMode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::error::{Parameter, RedisGuardError};

/// How a connection to `rediss://` servers checks them and, optionally,
/// identifies itself: with the system's trusted roots unless a root CA is
/// given.
///
/// ```no_run
/// # smol::block_on(async {
/// use std::time::Duration;
/// use guard_redis::{RedisConnection, RedisTls, Topology};
///
/// let tls = RedisTls::new().with_root_ca(std::fs::read("ca.pem")?)?;
/// let conn = RedisConnection::connect_with_tls(
///     Topology::Standalone { url: "rediss://redis.internal:6380/".into() },
///     Duration::from_millis(500),
///     &tls,
/// ).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    root_ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key, and no certificate bytes either: only what is set.
        f.debug_struct("RedisTls")
            .field("root_ca", &self.root_ca.as_ref().map(|_| "<PEM>"))
            .field("client_identity", &self.identity.as_ref().map(|_| "<PEM>"))
            .finish()
    }
}

/// `(n bytes)`: how a PEM value is named in an error (its content is a
/// certificate, or a private key, and is never printed).
fn described(pem: &[u8]) -> String {
    format!("({} bytes)", pem.len())
}

/// The certificates of a PEM text, at least one.
pub(crate) fn certificates(
    pem: &[u8],
    parameter: Parameter,
) -> Result<Vec<CertificateDer<'static>>, RedisGuardError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            RedisGuardError::invalid(parameter, described(pem), format!("unreadable PEM: {e}"))
        })?;
    if certs.is_empty() {
        return Err(RedisGuardError::invalid(
            parameter,
            described(pem),
            "no certificate in it (a PEM block -----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

impl RedisTls {
    /// The system's trusted roots, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the certificate authorities of `pem` (one or more PEM
    /// certificates) instead of the system's roots: for servers whose
    /// certificates a private CA signed.
    pub fn with_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Result<Self, RedisGuardError> {
        let pem = pem.into();
        let mut roots = RootCertStore::empty();
        for cert in certificates(&pem, Parameter::TlsRootCa)? {
            roots.add(cert).map_err(|e| {
                RedisGuardError::invalid(
                    Parameter::TlsRootCa,
                    described(&pem),
                    format!("not a usable CA certificate: {e}"),
                )
            })?;
        }
        self.root_ca = Some(pem);
        Ok(self)
    }

    /// Presents `cert_pem` (the client certificate, then any intermediate
    /// ones) signed for `key_pem` (a PKCS#8, PKCS#1 or SEC1 private key),
    /// for servers that require client certificates (`tls-auth-clients`).
    pub fn with_client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Result<Self, RedisGuardError> {
        let (cert_pem, key_pem) = (cert_pem.into(), key_pem.into());
        let chain = certificates(&cert_pem, Parameter::TlsClientCert)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            RedisGuardError::invalid(
                Parameter::TlsClientKey,
                described(&key_pem),
                format!("no private key in it (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
            )
        })?;
        // What redis-rs will do with them at each connection, done once
        // here: a key of another certificate, or of an unsupported type,
        // is refused now.
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| RedisGuardError::Redis(std::io::Error::other(e).into()))?
            .with_root_certificates(RootCertStore::empty())
            .with_client_auth_cert(chain, key)
            .map_err(|e| {
                RedisGuardError::invalid(
                    Parameter::TlsClientKey,
                    described(&key_pem),
                    format!("not a usable key for the client certificate: {e}"),
                )
            })?;
        self.identity = Some((cert_pem, key_pem));
        Ok(self)
    }

    /// Whether a root CA replaces the system's roots.
    pub fn has_root_ca(&self) -> bool {
        self.root_ca.is_some()
    }

    /// Whether a client certificate is presented.
    pub fn has_client_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// A client of the `rediss://` server at `url`, with these settings:
    /// for what [`RedisConnection`](crate::RedisConnection) does not do (a
    /// blocking connection, a Pub/Sub subscription).
    pub fn client(&self, url: impl IntoConnectionInfo) -> Result<redis::Client, RedisGuardError> {
        ensure_crypto_provider();
        Ok(redis::Client::build_with_tls(url, self.certificates())?)
    }

    /// `builder` with these settings for every node.
    pub(crate) fn cluster(&self, builder: ClusterClientBuilder) -> ClusterClientBuilder {
        ensure_crypto_provider();
        builder.tls(TlsMode::Secure).certs(self.certificates())
    }

    /// A client of the master that the `rediss://` sentinels name for
    /// `service`, over TLS to both, with these settings for both; a
    /// username and password in the first sentinel URL authenticate to
    /// the sentinels (as a plain sentinel client does).
    pub(crate) fn sentinel(
        &self,
        sentinels: &[String],
        service: &str,
    ) -> redis::RedisResult<SentinelClient> {
        ensure_crypto_provider();
        let infos = sentinels
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let mut builder = SentinelClientBuilder::new(
            infos.iter().map(|info| info.addr().clone()),
            service,
            SentinelServerType::Master,
        )?
        .set_client_to_sentinel_certificates(self.certificates())
        .set_client_to_redis_tls_mode(TlsMode::Secure)
        .set_client_to_redis_certificates(self.certificates());
        if let Some(first) = infos.first().map(redis::ConnectionInfo::redis_settings) {
            if let Some(username) = first.username() {
                builder = builder.set_client_to_sentinel_username(username);
            }
            if let Some(password) = first.password() {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        builder.build()
    }

    /// The settings in redis-rs's terms.
    pub(crate) fn certificates(&self) -> TlsCertificates {
        TlsCertificates {
            client_tls: self.identity.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.root_ca.clone(),
        }
    }
}

/// redis-rs builds each connection's rustls configuration from the
/// process's default crypto provider, and has no parameter for one. When
/// none is installed, rustls picks the one its features name; with more
/// than one enabled in a program (another library may enable aws-lc-rs)
/// it cannot choose, and redis-rs would panic at the first TLS
/// connection. So ring (guard's) is installed if, and only if, no default
/// exists yet: a program's own choice always wins.
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // An error means another thread installed one meanwhile: it is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
