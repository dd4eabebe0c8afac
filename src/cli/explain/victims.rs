//! What `allot explain gang` says of a preemption: the victims the controller would choose now
//! (a what-if over the same pass; nothing is written).

use serde::Serialize;

use crate::control::gang::decision::Verdict;
use crate::model::resources::ResourceMatcher;

/// One unit of running work a waiting gang would evict.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VictimReport {
    /// `pod NS/NAME` or `gang NS/NAME` (a gang goes whole).
    pub unit: String,
    pub team: Option<String>,
    pub priority: i32,
    pub pods: Vec<String>,
    /// Accelerators it holds, e.g. `2 nvidia.com/gpu`.
    pub devices: Vec<String>,
    /// Seconds since it started (creation, or its gang's release).
    pub running_seconds: i64,
}

/// The victims of a `Preempt` verdict, cheapest first (none for any other verdict).
pub fn victims(verdict: &Verdict, accelerators: &ResourceMatcher, now: i64) -> Vec<VictimReport> {
    let Verdict::Preempt { victims, .. } = verdict else { return Vec::new() };
    victims
        .iter()
        .map(|v| VictimReport {
            unit: v.key.to_string(),
            team: v.team.clone(),
            priority: v.priority,
            pods: v.pods.iter().map(|p| p.name.clone()).collect(),
            devices: v.devices(accelerators).iter().map(|(r, q)| format!("{q} {r}")).collect(),
            running_seconds: now.saturating_sub(v.started).max(0),
        })
        .collect()
}

/// `gang ml/a (team ml, priority 100, 2 pods, 2 nvidia.com/gpu, running 3600s)`.
pub fn line(v: &VictimReport) -> String {
    let team = v.team.as_deref().map_or_else(|| "no team".to_string(), |t| format!("team {t}"));
    let mut parts = vec![team, format!("priority {}", v.priority), format!("{} pods", v.pods.len())];
    parts.extend(v.devices.iter().cloned());
    parts.push(format!("running {}s", v.running_seconds));
    format!("{} ({})", v.unit, parts.join(", "))
}
