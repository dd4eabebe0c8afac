//! Gangs as a request declares them: who is a member of which gang ([`membership`]) and how
//! large a member's placement may be ([`bounds`]). The controller that releases gangs is in
//! `control::gang`.

pub mod bounds;
pub mod membership;
