//! Certificates made by a test: a CA, a server certificate for
//! `127.0.0.1` and `localhost`, and a client certificate, all signed by
//! that CA and written as PEM files in a temporary directory of their own
//! (removed when the last clone is dropped).
//!
//! The servers of this crate take them for their TLS listeners
//! ([`RedisServer::start_tls`](crate::RedisServer::start_tls),
//! [`Mosquitto::start_tls`](crate::Mosquitto::start_tls)); a test hands
//! [`ca_pem`](TestCerts::ca_pem) to its client as the CA to trust.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::process::HarnessError;

/// A CA and the certificates it signed, as PEM text and files; cheap to
/// clone (the files live as long as any clone).
#[derive(Clone)]
pub struct TestCerts(Arc<Inner>);

struct Inner {
    dir: tempfile::TempDir,
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

impl fmt::Debug for TestCerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestCerts")
            .field("dir", &self.0.dir.path())
            .finish()
    }
}

fn failed(what: &str, e: impl fmt::Display) -> HarnessError {
    HarnessError::NotReady(format!("test certificates: {what}: {e}"))
}

impl TestCerts {
    /// Makes a new CA (ECDSA P-256, valid for decades), a server
    /// certificate for `127.0.0.1` and `localhost` and a client
    /// certificate, and writes them as PEM files.
    pub fn generate() -> Result<Self, HarnessError> {
        let ca_key = KeyPair::generate().map_err(|e| failed("CA key", e))?;
        let mut ca_params = CertificateParams::new(Vec::new()).map_err(|e| failed("CA", e))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "guard test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let ca = ca_params
            .self_signed(&ca_key)
            .map_err(|e| failed("CA", e))?;
        let issuer = Issuer::new(ca_params, ca_key);

        // The server's certificate serves as a client one too: Redis
        // presents it on the cluster bus and to a master it replicates
        // from (tls-cluster, tls-replication), Sentinel to the masters.
        let server_key = KeyPair::generate().map_err(|e| failed("server key", e))?;
        let mut server =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .map_err(|e| failed("server certificate", e))?;
        server
            .distinguished_name
            .push(DnType::CommonName, "guard test server");
        server.use_authority_key_identifier_extension = true;
        server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let server_cert = server
            .signed_by(&server_key, &issuer)
            .map_err(|e| failed("server certificate", e))?;

        let client_key = KeyPair::generate().map_err(|e| failed("client key", e))?;
        let mut client =
            CertificateParams::new(Vec::new()).map_err(|e| failed("client certificate", e))?;
        client
            .distinguished_name
            .push(DnType::CommonName, "guard test client");
        client.use_authority_key_identifier_extension = true;
        client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client
            .signed_by(&client_key, &issuer)
            .map_err(|e| failed("client certificate", e))?;

        let inner = Inner {
            dir: tempfile::tempdir()?,
            ca: ca.pem(),
            server_cert: server_cert.pem(),
            server_key: server_key.serialize_pem(),
            client_cert: client_cert.pem(),
            client_key: client_key.serialize_pem(),
        };
        for (name, pem) in [
            ("ca.pem", &inner.ca),
            ("server.pem", &inner.server_cert),
            ("server.key", &inner.server_key),
            ("client.pem", &inner.client_cert),
            ("client.key", &inner.client_key),
        ] {
            std::fs::write(inner.dir.path().join(name), pem)?;
        }
        Ok(TestCerts(Arc::new(inner)))
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.0.ca
    }

    /// The CA certificate (DER), as a client without a PEM parser (an
    /// MCU's TLS stack) takes its trust anchor.
    pub fn ca_der(&self) -> Result<Vec<u8>, HarnessError> {
        CertificateDer::from_pem_slice(self.0.ca.as_bytes())
            .map(|der| der.to_vec())
            .map_err(|e| failed("CA as DER", e))
    }

    /// The client certificate (PEM), signed by the CA.
    pub fn client_cert_pem(&self) -> &str {
        &self.0.client_cert
    }

    /// The client certificate's private key (PKCS#8 PEM).
    pub fn client_key_pem(&self) -> &str {
        &self.0.client_key
    }

    /// The CA certificate's file.
    pub fn ca_path(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// The server certificate's file (for `127.0.0.1` and `localhost`).
    pub fn server_cert_path(&self) -> PathBuf {
        self.path("server.pem")
    }

    /// The server key's file.
    pub fn server_key_path(&self) -> PathBuf {
        self.path("server.key")
    }

    /// The client certificate's file.
    pub fn client_cert_path(&self) -> PathBuf {
        self.path("client.pem")
    }

    /// The client key's file.
    pub fn client_key_path(&self) -> PathBuf {
        self.path("client.key")
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        self.0.dir.path()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.dir.path().join(name)
    }

    /// A rustls client configuration that trusts the CA and presents the
    /// client certificate (what the harness's own clients use).
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, HarnessError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.0.ca.as_bytes()) {
            roots
                .add(cert.map_err(|e| failed("CA PEM", e))?)
                .map_err(|e| failed("CA", e))?;
        }
        let chain = CertificateDer::pem_slice_iter(self.0.client_cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| failed("client PEM", e))?;
        let key = PrivateKeyDer::from_pem_slice(self.0.client_key.as_bytes())
            .map_err(|e| failed("client key PEM", e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| failed("TLS versions", e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| failed("client identity", e))?;
        Ok(Arc::new(config))
    }
}
