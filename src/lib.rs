//! Allot: an admission webhook policy server for Kubernetes clusters whose accelerators are
//! scarce and shared. One engine ([`admission::engine`]) behind several doors: the HTTPS
//! webhook server ([`server`]) and the offline dry run ([`cli::check`]).
//!
//! The folders follow the flow, and each imports only those above it in this list
//! (`tests/module_graph.rs` holds them to it):
//! - [`model`]: the leaf. Policies and their parsing, CEL, quantities and resources, DRA
//!   devices, workload kinds, gang membership: what a request or the cluster is made of.
//! - [`admission`]: one AdmissionReview in, one answer out. Decoding, the engine, mutation,
//!   the checks, and the interfaces it asks (quota books, the gang directory).
//! - [`control`]: what runs in the background. The cluster store fed by the watches, the gang
//!   controller (snapshot, decide, plan, act), the quota queue and the shared ledger.
//! - [`server`]: HTTP, TLS, metrics and the wiring of the above into one process.
//! - [`cli`]: one module per command.
#![forbid(unsafe_code)]
#![deny(rust_2018_idioms)]

pub mod admission;
pub mod cli;
pub mod control;
pub mod model;
pub mod server;

pub use model::error::{Error, Result};

/// Installs ring as the process-wide rustls crypto provider. Call first thing in `main` and in
/// every test binary that uses TLS; calling it twice is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
