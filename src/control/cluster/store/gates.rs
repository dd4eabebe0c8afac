//! How many live pods each of Allot's gates holds and when the oldest was created, kept as
//! watch events arrive (issue 49), so that a `/metrics` scrape reads them in O(1) per gate
//! instead of walking every pod.

use super::*;

/// Which of Allot's scheduling gates a [`GateGauge`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Gate {
    /// `allot.dev/gang`: waiting for its gang to assemble and fit.
    Gang,
    /// `allot.dev/quota`: waiting in its team's quota queue.
    Quota,
}

impl Gate {
    /// Both gates, in label order.
    pub const ALL: [Gate; 2] = [Gate::Gang, Gate::Quota];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Gang => "gang",
            Gate::Quota => "quota",
        }
    }

    /// Whether the gate holds `p` (whatever else holds it).
    pub fn holds(self, p: &PodRecord) -> bool {
        match self {
            Gate::Gang => p.gate_index.is_some(),
            Gate::Quota => p.quota_gate_index.is_some(),
        }
    }
}

/// Pods behind one of Allot's gates, and how long the oldest has been there.
#[derive(Debug, Clone, PartialEq)]
pub struct GateGauge {
    pub gate: Gate,
    pub pods: u64,
    /// Seconds since the oldest gated pod was created (gates are added only at CREATE, so
    /// that is how long it has been held); 0 when none is.
    pub oldest_seconds: i64,
}

impl GateGauge {
    /// The gauge of `gate` at `now` (seconds since the epoch), from the pods it holds and the
    /// creation of the oldest; shared with the reference walk so both age alike.
    pub fn at(gate: Gate, pods: u64, oldest_created: Option<i64>, now: i64) -> GateGauge {
        let oldest_seconds = oldest_created.map_or(0, |c| now.saturating_sub(c).max(0));
        GateGauge { gate, pods, oldest_seconds }
    }
}

/// The live (non-finished, not terminating) pods one gate holds: their count, and their
/// creation times as a multiset, whose first key is the oldest whichever pod leaves.
#[derive(Debug, Default)]
pub(super) struct Held {
    pods: u64,
    created: BTreeMap<i64, u32>,
}

/// [`Held`] for each gate, by its place in [`Gate::ALL`].
#[derive(Debug, Default)]
pub(super) struct HeldAtGates([Held; Gate::ALL.len()]);

impl HeldAtGates {
    /// Adds (`sign` 1) or takes away (-1) `record` at each gate holding it. Pods being deleted
    /// are going, not waiting: they count nothing (the caller skips finished ones).
    pub(super) fn delta(&mut self, record: &PodRecord, sign: i128) {
        if record.terminating {
            return;
        }
        for (held, gate) in self.0.iter_mut().zip(Gate::ALL) {
            if !gate.holds(record) {
                continue;
            }
            if sign > 0 {
                held.pods += 1;
                *held.created.entry(record.created).or_default() += 1;
            } else if let Some(n) = held.created.get_mut(&record.created) {
                held.pods = held.pods.saturating_sub(1);
                *n = n.saturating_sub(1);
                if *n == 0 {
                    held.created.remove(&record.created);
                }
            }
        }
    }

    fn gauges(&self, now: i64) -> Vec<GateGauge> {
        let oldest = |h: &Held| h.created.keys().next().copied();
        self.0.iter().zip(Gate::ALL).map(|(h, gate)| GateGauge::at(gate, h.pods, oldest(h), now)).collect()
    }
}

impl ClusterState {
    /// For each of Allot's gates (always both, so alerts see a 0 rather than no series): how many
    /// live pods it holds and the age of the oldest at `now` (seconds since the epoch). Pods
    /// being deleted are left out: they are going, not waiting. Kept by the store: O(1) a gate.
    pub fn gate_gauges(&self, now: i64) -> Vec<GateGauge> {
        read(&self.inner).by_state.gates.gauges(now)
    }
}
