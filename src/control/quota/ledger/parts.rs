//! A cohort's ledger: one ConfigMap for all of its deny-mode teams (`allot-cohort-COHORT`), so
//! that an admission of any of them is decided and committed against the whole cohort's usage
//! in one resourceVersion-guarded write: two replicas cannot both lend the same unused quota,
//! and a team's borrowing is never decided on a stale copy of another team's usage.
//!
//! Each team's part is an ordinary [`super::Ledger`], stored under its own key prefix
//! ([`part_prefix`]: `t`, 12 hex digits of the SHA-256 of the team's name, `.`), with a marker
//! key (prefix + [`PART_RECONCILED`]) that the reconciler writes with the part: a part without
//! one (a team that just joined the cohort) is not known yet, and admission refuses against it
//! as against an unreconciled ledger.

use std::collections::BTreeMap;

use sha2::Digest;

/// What ends the data key marking a part reconciled (its value: when, RFC 3339).
pub const PART_RECONCILED: &str = "reconciled";

/// The ledger object of a cohort (a DNS label, checked at load: the name is valid).
pub fn cohort_object_name(cohort: &str) -> String {
    format!("allot-cohort-{cohort}")
}

/// The key prefix of `team`'s part in its cohort's ledger.
pub fn part_prefix(team: &str) -> String {
    let digest = sha2::Sha256::digest(team.as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("t{hex}.")
}

/// The part under `prefix` (its keys without the prefix, the marker left out) and whether it
/// is marked reconciled.
pub fn part_of(data: &BTreeMap<String, String>, prefix: &str) -> (BTreeMap<String, String>, bool) {
    let mut part = BTreeMap::new();
    let mut reconciled = false;
    for (key, value) in data.range(prefix.to_string()..) {
        let Some(rest) = key.strip_prefix(prefix) else { break };
        if rest == PART_RECONCILED {
            reconciled = true;
        } else {
            part.insert(rest.to_string(), value.clone());
        }
    }
    (part, reconciled)
}

/// `data` with the part under `prefix` replaced by `part`; its marker is set to `reconciled`
/// when given, else kept as it was.
pub fn with_part(
    data: &BTreeMap<String, String>,
    prefix: &str,
    part: BTreeMap<String, String>,
    reconciled: Option<&str>,
) -> BTreeMap<String, String> {
    let marker = format!("{prefix}{PART_RECONCILED}");
    let kept_marker = data.get(&marker).cloned();
    let mut out: BTreeMap<String, String> =
        data.iter().filter(|(k, _)| !k.starts_with(prefix)).map(|(k, v)| (k.clone(), v.clone())).collect();
    out.extend(part.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)));
    if let Some(value) = reconciled.map(str::to_string).or(kept_marker) {
        out.insert(marker, value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn each_team_reads_and_writes_only_its_own_part() {
        let (a, b) = (part_prefix("vision"), part_prefix("speech"));
        assert_ne!(a, b);
        assert!(a.len() == 14 && a.starts_with('t') && a.ends_with('.'), "{a}");
        let object = with_part(&BTreeMap::new(), &a, data(&[("u.1", "x"), ("n.ns", "y")]), Some("t0"));
        let object = with_part(&object, &b, data(&[("u.2", "z")]), None);
        assert_eq!(part_of(&object, &a), (data(&[("u.1", "x"), ("n.ns", "y")]), true));
        assert_eq!(part_of(&object, &b), (data(&[("u.2", "z")]), false), "no marker until reconciled");
        // Rewriting one part keeps the other, and its own marker.
        let object = with_part(&object, &a, data(&[("u.3", "w")]), None);
        assert_eq!(part_of(&object, &a), (data(&[("u.3", "w")]), true));
        assert_eq!(part_of(&object, &b).0, data(&[("u.2", "z")]));
        assert_eq!(object.len(), 3);
    }
}
