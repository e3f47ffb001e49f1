//! MQTT over TLS (the `tls` feature): which certificate authorities the
//! client trusts and, for brokers that ask for one, the certificate it
//! presents. rustls with the ring provider, given to rumqttc as a ready
//! configuration, so no process-wide provider is involved.

use std::fmt;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use super::MqttError;
use crate::parameter::Parameter;

/// How an MQTT connection checks the broker over TLS and, optionally,
/// identifies itself: the system's trusted roots unless a root CA is
/// given. Certificates are checked when given.
///
/// ```no_run
/// use guard_endpoints::mqtt::{MqttOptions, MqttTls};
///
/// let tls = MqttTls::new().with_root_ca(std::fs::read("ca.pem")?)?;
/// let options = MqttOptions::new("broker.internal", 8883, "gateway-1")?.with_tls(tls);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct MqttTls {
    root_ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for MqttTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key, and no certificate bytes either: only what is set.
        f.debug_struct("MqttTls")
            .field("root_ca", &self.root_ca.as_ref().map(|_| "<PEM>"))
            .field("client_identity", &self.identity.as_ref().map(|_| "<PEM>"))
            .finish()
    }
}

/// `(n bytes)`: how a PEM value is named in an error (never its content).
fn described(pem: &[u8]) -> String {
    format!("({} bytes)", pem.len())
}

fn certificates(
    pem: &[u8],
    parameter: Parameter,
) -> Result<Vec<CertificateDer<'static>>, MqttError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            MqttError::invalid(parameter, described(pem), format!("unreadable PEM: {e}"))
        })?;
    if certs.is_empty() {
        return Err(MqttError::invalid(
            parameter,
            described(pem),
            "no certificate in it (a PEM block -----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

fn roots(pem: &[u8]) -> Result<RootCertStore, MqttError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(pem, Parameter::TlsRootCa)? {
        roots.add(cert).map_err(|e| {
            MqttError::invalid(
                Parameter::TlsRootCa,
                described(pem),
                format!("not a usable CA certificate: {e}"),
            )
        })?;
    }
    Ok(roots)
}

impl MqttTls {
    /// The system's trusted roots, no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the certificate authorities of `pem` (one or more PEM
    /// certificates) instead of the system's roots.
    pub fn with_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Result<Self, MqttError> {
        let pem = pem.into();
        roots(&pem)?;
        self.root_ca = Some(pem);
        Ok(self)
    }

    /// Presents `cert_pem` (the client certificate, then any intermediate
    /// ones) signed for `key_pem` (a PKCS#8, PKCS#1 or SEC1 private key),
    /// for brokers that require client certificates.
    pub fn with_client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Result<Self, MqttError> {
        let (cert_pem, key_pem) = (cert_pem.into(), key_pem.into());
        certificates(&cert_pem, Parameter::TlsClientCert)?;
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
            MqttError::invalid(
                Parameter::TlsClientKey,
                described(&key_pem),
                format!("no private key in it (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
            )
        })?;
        let candidate = MqttTls {
            root_ca: None,
            identity: Some((cert_pem, key_pem)),
        };
        // The configuration each connection builds, built once here: a
        // key of another certificate is refused now.
        candidate.config_with(RootCertStore::empty())?;
        self.identity = candidate.identity;
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

    /// The rustls configuration of one connection: also what another
    /// client (the HTTP sink's `with_tls`) is given of the same files.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, MqttError> {
        let roots = match &self.root_ca {
            Some(pem) => roots(pem)?,
            None => {
                let found = rustls_native_certs::load_native_certs();
                let mut roots = RootCertStore::empty();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(MqttError::invalid(
                        Parameter::TlsRootCa,
                        "",
                        "none given, and no trusted roots found on this system: give the broker's CA",
                    ));
                }
                roots
            }
        };
        self.config_with(roots).map(Arc::new)
    }

    fn config_with(&self, roots: RootCertStore) -> Result<ClientConfig, MqttError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| MqttError::invalid(Parameter::TlsRootCa, "", e.to_string()))?
            .with_root_certificates(roots);
        match &self.identity {
            None => Ok(builder.with_no_client_auth()),
            Some((cert_pem, key_pem)) => {
                let chain = certificates(cert_pem, Parameter::TlsClientCert)?;
                let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
                    MqttError::invalid(
                        Parameter::TlsClientKey,
                        described(key_pem),
                        format!("no private key in it: {e}"),
                    )
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    MqttError::invalid(
                        Parameter::TlsClientKey,
                        described(key_pem),
                        format!("not a usable key for the client certificate: {e}"),
                    )
                })
            }
        }
    }
}
