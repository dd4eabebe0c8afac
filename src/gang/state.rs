//! The names `src/server` still imports from here. The cluster view moved to [`crate::cluster`];
//! new code imports it from there (this file goes once the server does).

pub use crate::cluster::{AcceleratorUsage, ClusterState};
