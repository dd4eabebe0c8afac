//! What runs beside admission: the cluster view the watches keep ([`cluster`]), the gang
//! controller that releases, holds and preempts gangs over it ([`gang`]), and quota's live
//! books, queue and shared ledger ([`quota`]).

pub mod cluster;
pub mod gang;
pub mod quota;
