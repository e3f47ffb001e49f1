//! The server's certificate checked against one CA, and a CA checked
//! before the first handshake.

use embedded_tls::pki::CertVerifier;
use embedded_tls::{
    Aes128GcmSha256, Certificate, CryptoProvider, CryptoRngCore, NoClock, TlsError, TlsVerifier,
};

/// The largest certificate of the server's chain the verifier takes.
pub const MAX_CERTIFICATE: usize = 2048;

/// Checks the server's certificate chain against one CA, for the server
/// name of the `TlsConfig`; `R` is the randomness.
pub struct CaVerified<'a, R> {
    rng: &'a mut R,
    verifier: CertVerifier<'a, Aes128GcmSha256, NoClock, MAX_CERTIFICATE>,
}

impl<'a, R: CryptoRngCore> CaVerified<'a, R> {
    /// A provider trusting the CA certificate `ca` (DER) alone.
    pub fn new(ca: &'a [u8], rng: &'a mut R) -> Self {
        CaVerified {
            rng,
            verifier: CertVerifier::new(Certificate::X509(ca)),
        }
    }
}

impl<R: CryptoRngCore> CryptoProvider for CaVerified<'_, R> {
    type CipherSuite = Aes128GcmSha256;
    type Signature = &'static [u8];

    fn rng(&mut self) -> impl CryptoRngCore {
        &mut *self.rng
    }

    fn verifier(&mut self) -> Result<&mut impl TlsVerifier<Aes128GcmSha256>, TlsError> {
        Ok(&mut self.verifier)
    }
}

/// A CA certificate that cannot be one: what is wrong with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidCa {
    /// No bytes.
    Empty,
    /// It does not start as a DER `SEQUENCE` (a PEM file starts
    /// `-----BEGIN`: convert it to DER).
    NotDer,
    /// Its length says `declared` bytes but `len` are given.
    Length {
        /// The bytes the DER header declares, header included.
        declared: usize,
        /// The bytes given.
        len: usize,
    },
}

impl core::fmt::Display for InvalidCa {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            InvalidCa::Empty => f.write_str("the CA certificate is empty"),
            InvalidCa::NotDer => f.write_str(
                "the CA certificate is not DER (a PEM file starts with -----BEGIN: convert it with `openssl x509 -outform der`)",
            ),
            InvalidCa::Length { declared, len } => write!(
                f,
                "the CA certificate declares {declared} bytes but {len} are given (cut short, or more than one)"
            ),
        }
    }
}

impl core::error::Error for InvalidCa {}

/// Checks that `der` is exactly one DER `SEQUENCE` (an X.509 certificate
/// is one); its content is checked at each handshake.
pub(super) fn check_der(der: &[u8]) -> Result<(), InvalidCa> {
    let (&tag, rest) = der.split_first().ok_or(InvalidCa::Empty)?;
    if tag != 0x30 {
        return Err(InvalidCa::NotDer);
    }
    let (&first, rest) = rest.split_first().ok_or(InvalidCa::NotDer)?;
    // Short form: the length itself; long form: 0x80 | the number of
    // length bytes that follow (at most 4 here: no certificate is larger).
    let (content, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let count = usize::from(first & 0x7f);
        let Some(bytes) = rest.get(..count).filter(|_| (1..=4).contains(&count)) else {
            return Err(InvalidCa::NotDer);
        };
        let content = bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b));
        (content, 2 + count)
    };
    let declared = content.saturating_add(header);
    if declared != der.len() {
        return Err(InvalidCa::Length {
            declared,
            len: der.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{InvalidCa, check_der};

    #[test]
    fn a_ca_must_be_one_der_sequence() {
        assert_eq!(check_der(&[]), Err(InvalidCa::Empty));
        assert_eq!(
            check_der(b"-----BEGIN CERTIFICATE-----"),
            Err(InvalidCa::NotDer)
        );
        assert_eq!(check_der(&[0x30]), Err(InvalidCa::NotDer));
        assert_eq!(check_der(&[0x30, 0x80]), Err(InvalidCa::NotDer));
        assert_eq!(
            check_der(&[0x30, 0x85, 1, 1, 1, 1, 1]),
            Err(InvalidCa::NotDer)
        );
        assert_eq!(check_der(&[0x30, 0x82, 0x01]), Err(InvalidCa::NotDer));
        assert_eq!(check_der(&[0x30, 0x02, 0x05, 0x00]), Ok(()));
        assert_eq!(
            check_der(&[0x30, 0x02, 0x05]),
            Err(InvalidCa::Length {
                declared: 4,
                len: 3
            })
        );
        assert_eq!(
            check_der(&[0x30, 0x01, 0x05, 0x30]),
            Err(InvalidCa::Length {
                declared: 3,
                len: 4
            })
        );
        let mut long = [0u8; 300];
        long[..4].copy_from_slice(&[0x30, 0x82, 0x01, 0x28]);
        assert_eq!(check_der(&long), Ok(()));
    }
}
