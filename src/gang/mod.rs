//! Gangs: Pods that must start together. Membership at admission ([`membership`]), the
//! placement simulation ([`fit`]) and the controller's pure decision ([`decision`]).

pub mod controller;
pub mod decision;
pub mod directory;
pub mod fit;
pub mod membership;
pub mod metrics;
pub mod state;

#[cfg(test)]
mod tests;
