//! Allot: an admission webhook policy server for Kubernetes clusters whose accelerators are
//! scarce and shared. One engine ([`engine`]) behind several doors: the HTTPS webhook server
//! ([`server`]) and the offline dry run ([`check`]).
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod admission;
pub mod apivalidation;
pub mod certs;
pub mod check;
pub mod cli;
pub mod cluster;
pub mod covers;
pub mod documents;
pub mod dra;
pub mod engine;
pub mod error;
pub mod explain;
pub mod expression;
pub mod files;
pub mod finding;
#[cfg(test)]
mod fixtures;
pub mod gang;
pub mod github;
pub mod json;
pub mod junit;
pub mod logging;
pub mod mutate;
pub mod namespaces;
pub mod native;
pub mod patch;
pub mod policy;
pub mod quantity;
pub mod quota;
pub mod request;
pub mod resources;
pub mod server;
pub mod suite;
pub mod tenant;
pub mod validate;
pub mod webhooks;
pub mod workload;

pub use error::{Error, Result};

/// Installs ring as the process-wide rustls crypto provider. Call first thing in `main` and in
/// every test binary that uses TLS; calling it twice is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
