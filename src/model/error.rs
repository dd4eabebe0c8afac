//! One error type for the library. Messages are written for the person who runs `allot` or
//! `kubectl apply`: they say where the problem is (file, document, field) and what to change.

use std::path::PathBuf;

/// Everything the library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A policy or manifest file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A policy document is invalid; `location` names file, document index and field path.
    #[error("{location}: {message}")]
    Policy { location: String, message: String },
    /// A manifest given to `allot check` could not be parsed.
    #[error("{location}: {message}")]
    Manifest { location: String, message: String },
    /// Certificates could not be generated, read or used.
    #[error("certificates: {0}")]
    Certificates(String),
    /// `allot serve` cannot tell who it is, or was told something the API server contradicts
    /// (`server::identity`).
    #[error("identity: {0}")]
    Identity(String),
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
