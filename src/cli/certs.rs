//! `allot certs`: a CA and a serving certificate for development and for clusters without
//! cert-manager.
//!
//! Rotation-friendly: when `--out` already holds `ca.crt` and `ca.key`, the existing CA signs the
//! new serving certificate, so the webhooks' `caBundle` stays valid and a running `allot serve`
//! picks the new certificate up without a restart.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

use crate::model::error::Error;

/// What `allot certs` wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// True when an existing CA was reused.
    pub reused_ca: bool,
}

fn cert_error(context: &str) -> impl Fn(rcgen::Error) -> Error + '_ {
    move |e| Error::Certificates(format!("{context}: {e}"))
}

fn write(path: &Path, contents: &str, private: bool) -> Result<(), Error> {
    let io = |source| Error::Io { path: path.to_path_buf(), source };
    if !private {
        return std::fs::write(path, contents).map_err(io);
    }
    // A private key is never readable by anyone else, not even for a moment: it goes into a
    // fresh file created 0600, which then replaces `path` in one rename (also what a watching
    // `allot serve` wants: it never sees a half-written key).
    let temporary = path.with_file_name(format!(
        ".{}.{}.tmp",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        std::process::id()
    ));
    let written = create_private(&temporary).and_then(|mut file| {
        use std::io::Write;
        file.write_all(contents.as_bytes())?;
        file.sync_all()
    });
    if let Err(source) = written.and_then(|()| std::fs::rename(&temporary, path)) {
        let _ = std::fs::remove_file(&temporary);
        return Err(io(source));
    }
    Ok(())
}

/// A new file that only its owner can read and write, from the moment it exists.
fn create_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// Writes `ca.crt`, `ca.key`, `tls.crt` and `tls.key` under `out`; the serving certificate is
/// valid for `dns_names` (IP addresses become IP SANs) for `days` days.
pub fn generate(out: &Path, dns_names: &[String], days: u32) -> Result<Written, Error> {
    if dns_names.is_empty() {
        return Err(Error::Certificates("give at least one --dns-name".into()));
    }
    std::fs::create_dir_all(out).map_err(|source| Error::Io { path: out.to_path_buf(), source })?;
    let ca_cert_path = out.join("ca.crt");
    let ca_key_path = out.join("ca.key");
    let now = OffsetDateTime::now_utc();

    let reused_ca = ca_cert_path.exists() && ca_key_path.exists();
    let (ca_pem, ca_key) = if reused_ca {
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|source| Error::Io { path: p.to_path_buf(), source });
        let key = KeyPair::from_pem(&read(&ca_key_path)?).map_err(cert_error("ca.key"))?;
        (read(&ca_cert_path)?, key)
    } else {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_error("CA"))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "allot webhook CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.not_before = now - Duration::hours(1);
        params.not_after = now + Duration::days(3650);
        let key = KeyPair::generate().map_err(cert_error("CA key"))?;
        let cert = params.self_signed(&key).map_err(cert_error("CA"))?;
        write(&ca_cert_path, &cert.pem(), false)?;
        write(&ca_key_path, &key.serialize_pem(), true)?;
        (cert.pem(), key)
    };
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(cert_error("ca.crt"))?;

    let mut params = CertificateParams::new(dns_names.to_vec()).map_err(cert_error("serving certificate"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, dns_names[0].as_str());
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(i64::from(days));
    let key = KeyPair::generate().map_err(cert_error("serving key"))?;
    let cert = params.signed_by(&key, &issuer).map_err(cert_error("serving certificate"))?;
    let written = Written {
        ca_cert: ca_cert_path,
        ca_key: ca_key_path,
        cert: out.join("tls.crt"),
        key: out.join("tls.key"),
        reused_ca,
    };
    // Key first: a reloader that sees the new certificate must find its key already there.
    write(&written.key, &key.serialize_pem(), true)?;
    write(&written.cert, &cert.pem(), false)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_then_reuses_the_ca() {
        crate::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["allot.allot-system.svc".to_string(), "127.0.0.1".to_string()];
        let first = generate(dir.path(), &names, 30).unwrap();
        assert!(!first.reused_ca);
        let ca = std::fs::read(&first.ca_cert).unwrap();
        crate::server::tls::server_config(&first.cert, &first.key).unwrap();
        let second = generate(dir.path(), &names, 30).unwrap();
        assert!(second.reused_ca);
        assert_eq!(std::fs::read(&second.ca_cert).unwrap(), ca, "the CA must not change on rotation");
        crate::server::tls::server_config(&second.cert, &second.key).unwrap();
    }

    #[cfg(unix)]
    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    /// Keys are 0600 from creation on, whatever the umask, and a rotation over an existing
    /// world-readable key file leaves a 0600 file too.
    #[cfg(unix)]
    #[test]
    fn key_files_are_private_from_the_start() {
        use std::os::unix::fs::PermissionsExt;
        crate::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("fresh.key");
        let file = create_private(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o600, "before anything is written");
        drop(file);
        assert!(create_private(&fresh).is_err(), "never reuses (and so never keeps the mode of) an existing file");

        let names = vec!["allot.test".to_string()];
        let written = generate(dir.path(), &names, 30).unwrap();
        assert_eq!(mode(&written.key), 0o600);
        assert_eq!(mode(&written.ca_key), 0o600);
        std::fs::set_permissions(&written.key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let rotated = generate(dir.path(), &names, 30).unwrap();
        assert_eq!(mode(&rotated.key), 0o600);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn needs_a_name() {
        let dir = tempfile::tempdir().unwrap();
        assert!(generate(dir.path(), &[], 30).is_err());
    }
}
