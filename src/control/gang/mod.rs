//! Gangs: Pods that must start together. Membership at admission ([`membership`], checked
//! against peers through [`directory`]), how large a member's placement may be ([`bounds`]),
//! the placement simulation ([`fit`]), the pure decision ([`decision`]) over a [`snapshot`] of
//! the cluster view, the [`plan`] that turns decisions into actions, and the [`controller`] that
//! watches, plans and calls the API.

pub mod controller;
pub mod decision;
pub mod devices;
pub mod disruption;
pub mod events;
pub mod evicting;
pub mod eviction;
pub mod fit;
pub mod hand_off;
pub mod lease;
pub mod metrics;
pub mod owners;
pub mod plan;
pub mod preemption;
pub mod refusal;
pub mod snapshot;
pub mod victims;
pub mod watches;
pub mod writes;

#[cfg(test)]
mod tests;
