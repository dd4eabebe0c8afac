//! The serving certificate: loaded from PEM files, ALPN `h2` + `http/1.1`, reloaded in place.

use std::path::Path;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::Error;

/// Builds a rustls server config from a certificate chain and key in PEM files.
///
/// ALPN is set explicitly: `RustlsConfig::from_config` leaves it as given, and without it a
/// client cannot negotiate HTTP/2.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, Error> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| Error::Certificates(format!("{}: {e}", cert.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Certificates(format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(Error::Certificates(format!("{}: no certificate found", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| Error::Certificates(format!("{}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Certificates(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| Error::Certificates(format!("certificate and key do not form a usable pair: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
