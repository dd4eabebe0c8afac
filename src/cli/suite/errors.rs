//! Why a test's policies, usage or case objects cannot be loaded. Each message is one line of
//! the suite's problem list ([`super::SuiteError::Invalid`]), after the test and case it is in.

use std::path::PathBuf;

/// Why the policies a test names cannot be read or compiled.
#[derive(Debug, thiserror::Error)]
pub enum PolicySourceError {
    /// A policy file or directory named by the test (or `--policies`) cannot be read.
    #[error("{}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A problem the policy reader found in a policy directory (a file, a document).
    #[error("{0}")]
    Directory(String),
    /// The policies were read but do not compile.
    #[error("{0}")]
    Compile(String),
}

impl PolicySourceError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PolicySourceError::Unreadable { .. } => "unreadable",
            PolicySourceError::Directory(_) => "directory",
            PolicySourceError::Compile(_) => "compile",
        }
    }
}

/// Why a test's (or case's) `usage` cannot be charged.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The usage names a team the policies do not define.
    #[error("{field}.teams.{team}: no Team named {team:?} in the policies (teams: {})", .known.join(", "))]
    UnknownTeam { field: String, team: String, known: Vec<String> },
    /// A team's amounts are not quantities of resources.
    #[error(transparent)]
    Amounts(#[from] crate::admission::quota::AmountError),
}

impl UsageError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            UsageError::UnknownTeam { .. } => "unknown_team",
            UsageError::Amounts(_) => "amounts",
        }
    }
}

/// Why a case has no one object to test.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("give resource or path, not both")]
    ResourceAndPath,
    #[error("no resource: give resource (an inline object) or path (a manifest file)")]
    NoResource,
    #[error("select: only with path")]
    SelectWithoutPath,
    #[error("resource: not a Kubernetes object (expected a mapping)")]
    NotAnObject,
    #[error("resource: apiVersion is missing")]
    NoApiVersion,
    #[error("resource: kind is missing")]
    NoKind,
    #[error("resource: a case tests one object, not a List")]
    List,
    /// The manifest file the case names cannot be read, or does not parse.
    #[error("path: {0}")]
    Manifests(#[source] crate::model::error::Error),
    /// The manifest file holds no object, or not exactly one that `select` picks.
    #[error(transparent)]
    Select(#[from] SelectError),
}

impl CaseError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            CaseError::ResourceAndPath => "resource_and_path",
            CaseError::NoResource => "no_resource",
            CaseError::SelectWithoutPath => "select_without_path",
            CaseError::NotAnObject => "not_an_object",
            CaseError::NoApiVersion => "no_api_version",
            CaseError::NoKind => "no_kind",
            CaseError::List => "list",
            CaseError::Manifests(_) => "manifests",
            CaseError::Select(e) => e.metric_label(),
        }
    }
}

/// Why the objects of a case's manifest file do not come down to one.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// `select` matches none of the file's objects (each described, for the fix).
    #[error("select: no object of {path} matches; it holds {}", .objects.join(", "))]
    NoMatch { path: String, objects: Vec<String> },
    /// The file holds no object at all.
    #[error("path: {path} holds no object")]
    Empty { path: String },
    /// Several objects match.
    #[error(
        "path: {} objects of {path} match ({}); pick one with select: {{kind, name, namespace, document}}",
        .matching.len(),
        .matching.join(", ")
    )]
    Ambiguous { path: String, matching: Vec<String> },
}

impl SelectError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            SelectError::NoMatch { .. } => "no_match",
            SelectError::Empty { .. } => "empty",
            SelectError::Ambiguous { .. } => "ambiguous",
        }
    }
}
