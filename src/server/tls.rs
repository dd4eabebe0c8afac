//! The serving certificate: loaded from PEM files, ALPN `h2` + `http/1.1`, reloaded in place.

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::model::error::Error;

/// Builds a rustls server config from a certificate chain and key in PEM files.
///
/// ALPN is set explicitly: `RustlsConfig::from_config` leaves it as given, and without it a
/// client cannot negotiate HTTP/2.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, Error> {
    server_config_with_client_ca(cert, key, None)
}

/// Like [`server_config`]; with `client_ca`, every client must present a certificate signed by
/// a CA in that PEM file (the API server's, set in its AdmissionConfiguration kubeconfig), or
/// the handshake fails: only the API server can then reach the webhooks.
pub fn server_config_with_client_ca(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, Error> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| Error::Certificates(format!("{}: {e}", cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Certificates(format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(Error::Certificates(format!("{}: no certificate found", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| Error::Certificates(format!("{}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Certificates(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => builder.with_client_cert_verifier(client_verifier(path, provider)?),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| Error::Certificates(format!("certificate and key do not form a usable pair: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// When the serving certificate (the first in the PEM file `cert`) expires, in seconds since the
/// epoch: `allot_certificate_expiry_timestamp_seconds`, so an alert fires weeks before the
/// webhooks' TLS breaks. `None` when the file holds no certificate that parses.
pub fn not_after(cert: &Path) -> Option<i64> {
    let der = CertificateDer::pem_file_iter(cert).ok()?.next()?.ok()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some(parsed.validity().not_after.timestamp())
}

/// Verifies client certificates against the CAs in `path` (ring, like the rest of the stack).
fn client_verifier(
    path: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, Error> {
    let context = |e: &dyn std::fmt::Display| Error::Certificates(format!("--client-ca {}: {e}", path.display()));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| context(&e))? {
        roots.add(cert.map_err(|e| context(&e))?).map_err(|e| context(&e))?;
    }
    if roots.is_empty() {
        return Err(context(&"no CA certificate found"));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| context(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_after_reads_the_serving_certificates_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 5, 17);
        let leaf = params.self_signed(&key).unwrap();
        params.not_after = rcgen::date_time_ymd(2040, 1, 1);
        let other = params.self_signed(&key).unwrap();
        // A chain: the first certificate of the file is the serving one.
        let path = dir.path().join("tls.crt");
        std::fs::write(&path, format!("{}{}", leaf.pem(), other.pem())).unwrap();
        assert_eq!(not_after(&path), Some(1_936_742_400)); // 2031-05-17T00:00:00Z
        std::fs::write(dir.path().join("bad.crt"), "not a certificate\n").unwrap();
        assert_eq!(not_after(&dir.path().join("bad.crt")), None);
        assert_eq!(not_after(&dir.path().join("missing.crt")), None);
    }
}
