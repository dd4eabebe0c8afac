//! The leaf layer: what a request or the cluster is made of, with no I/O and nothing of the
//! layers above. Policies and their parsing ([`policy`]), CEL ([`expression`]), quantities and
//! resource lists, DRA devices ([`dra`]), workload kinds and their Pod templates ([`workload`]),
//! gang membership and placement bounds ([`gang`]), what a gang counts against a quota
//! ([`tally`]), namespaces' labels, JSON helpers and patches.

pub mod apivalidation;
pub mod clock;
pub mod documents;
pub mod dra;
pub mod error;
pub mod expression;
pub mod files;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod gang;
pub mod json;
pub mod namespaces;
pub mod patch;
pub mod policy;
pub mod quantity;
pub mod resources;
pub mod tally;
pub mod workload;
