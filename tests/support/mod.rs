//! Shared helpers for integration tests.
#![allow(dead_code)] // each test binary uses a different subset

pub mod cluster;
