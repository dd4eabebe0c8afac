//! What admission knows about a gang's other members, to deny a Pod whose gang metadata
//! disagrees with theirs (size, priority class, scheduler). The server fills it from the
//! controller's Pod watch; `allot check` from the manifests of the same run.

use std::collections::HashMap;

use serde_json::Value;

use crate::model::gang::membership::{Membership, PodFacts};
use crate::model::json::Fields;
use crate::model::namespaces::NamespaceLabels;
use crate::model::policy::PolicySet;

/// One existing member, as far as consistency checks care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub pod: String,
    pub size: Option<u32>,
    pub priority_class: Option<String>,
    pub scheduler_name: Option<String>,
}

impl Peer {
    /// The peer summary of a Pod (JSON) in `gang`. `global_default` is the cluster's
    /// `globalDefault` PriorityClass (the Cluster policy's `priority.globalDefault`).
    pub fn of(pod: &Value, gang: &Membership, global_default: Option<&str>) -> Peer {
        // `Fields::field`, not `Value::pointer`: a pointer unescapes each of its segments into a
        // new String, and this runs for every gang member under review.
        let text = |path: &[&str]| pod.text(path).map(String::from);
        Peer {
            pod: text(&["metadata", "name"]).unwrap_or_default(),
            size: gang.size,
            priority_class: text(&["spec", "priorityClassName"]),
            // As the API server defaults it: a manifest (`allot check`) or a custom resource's
            // template names none, the pods made of it will have it.
            scheduler_name: text(&["spec", "schedulerName"]).or_else(|| Some(DEFAULT_SCHEDULER.to_string())),
        }
        .naming_the_global_default(global_default)
    }

    /// The member as the API server makes it: its Priority plugin names the cluster's
    /// `globalDefault` PriorityClass on a Pod that names none, so a manifest or a template
    /// naming none makes pods that name it (and a watched Pod naming none was made where there
    /// was no global default then).
    pub fn naming_the_global_default(mut self, global_default: Option<&str>) -> Peer {
        if self.priority_class.is_none() {
            self.priority_class = global_default.map(String::from);
        }
        self
    }

    /// What members of one gang must agree on, in the order they are compared.
    pub const FIELDS: [&'static str; 3] = ["size", "priorityClassName", "schedulerName"];

    /// True when `self` and `other` differ on `field` (one of [`Peer::FIELDS`]); compares the
    /// values themselves: this runs for every member under review.
    pub fn differs(&self, other: &Peer, field: &str) -> bool {
        match field {
            "size" => self.size != other.size,
            "priorityClassName" => self.priority_class != other.priority_class,
            _ => self.scheduler_name != other.scheduler_name,
        }
    }

    /// One compared field's value as messages show it (`(unset)` for none).
    pub fn shown(&self, field: &str) -> String {
        let value = match field {
            "size" => self.size.map(|n| n.to_string()),
            "priorityClassName" => self.priority_class.clone(),
            _ => self.scheduler_name.clone(),
        };
        value.unwrap_or_else(|| "(unset)".to_string())
    }

    /// The first field ([`Peer::FIELDS`] order) on which `self` and `other` differ, with each
    /// one's value as shown.
    pub fn first_difference(&self, other: &Peer) -> Option<(&'static str, String, String)> {
        let field = Self::FIELDS.into_iter().find(|f| self.differs(other, f))?;
        Some((field, self.shown(field), other.shown(field)))
    }
}

/// The scheduler the API server gives a Pod that names none.
const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Lookup of a gang's existing members.
pub trait GangDirectory: Send + Sync {
    /// Members of gang `name` in `namespace` known so far.
    fn peers(&self, namespace: &str, name: &str) -> Vec<Peer>;
    /// The pods of `namespace` that name a shared ResourceClaim `claim` (by name) and were
    /// counted for an earlier object of that name (the cluster view; none elsewhere).
    fn pods_naming_claim(&self, _namespace: &str, _claim: &str) -> Vec<String> {
        Vec::new()
    }
    /// What the cluster view knows of node `name` ([`NodeLookup::NotWatched`] where there is
    /// no view of the nodes: `allot check`, a view not listed yet).
    fn node(&self, _name: &str) -> NodeLookup {
        NodeLookup::NotWatched
    }
}

/// A node named by a Pod's `spec.nodeName`, as the cluster view knows it.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeLookup {
    /// Nodes are not watched here, or not listed yet: nothing can be said.
    NotWatched,
    /// The nodes are listed and none has this name (yet: one may join under it later).
    Unknown,
    /// The node, with its taints.
    Taints(Vec<k8s_openapi::api::core::v1::Taint>),
}

/// No knowledge of other members.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoGangs;

impl GangDirectory for NoGangs {
    fn peers(&self, _: &str, _: &str) -> Vec<Peer> {
        Vec::new()
    }
}

/// A fixed directory (the Pods of one `allot check` run).
#[derive(Debug, Default, Clone)]
pub struct StaticGangs(pub HashMap<(String, String), Vec<Peer>>);

impl StaticGangs {
    /// Indexes the gang members among `pods` (namespace, Pod JSON), under each namespace's
    /// GangPolicy as admission applies it (teams resolved from `labels`).
    pub fn from_pods<'a>(
        pods: impl IntoIterator<Item = (&'a str, &'a Value)>,
        policies: &PolicySet,
        labels: &dyn NamespaceLabels,
    ) -> StaticGangs {
        let mut map: HashMap<(String, String), Vec<Peer>> = HashMap::new();
        for (namespace, pod) in pods {
            let team = crate::model::namespaces::team_of(policies, namespace, labels).team;
            if let Ok(Some(gang)) =
                policies.gang_of(&PodFacts::from_json(pod), namespace, team.map(|t| t.name.as_str()))
            {
                map.entry((namespace.to_string(), gang.name.clone())).or_default().push(Peer::of(
                    pod,
                    &gang,
                    policies.priority.global_default.as_deref(),
                ));
            }
        }
        StaticGangs(map)
    }
}

impl GangDirectory for StaticGangs {
    fn peers(&self, namespace: &str, name: &str) -> Vec<Peer> {
        self.0.get(&(namespace.to_string(), name.to_string())).cloned().unwrap_or_default()
    }
}

/// The first disagreement between `me` and the other members, as a denial message.
pub fn disagreement(gang: &str, me: &Peer, peers: &[Peer]) -> Option<String> {
    peers.iter().filter(|p| p.pod != me.pod).find_map(|p| {
        let (field, mine, theirs) = me.first_difference(p)?;
        Some(format!(
            "gang {gang}: this pod has {field} {mine}, member {} has {theirs}; all members of a gang must agree",
            p.pod
        ))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Peer, disagreement};
    use crate::model::gang::membership::{Membership, Source};

    fn peer(pod: serde_json::Value) -> Peer {
        Peer::of(&pod, &Membership { name: "g".into(), size: Some(2), source: Source::Explicit }, None)
    }

    #[test]
    fn a_peer_is_read_from_the_pods_name_priority_class_and_scheduler() {
        let me = peer(json!({
            "metadata": {"name": "w-0"},
            "spec": {"priorityClassName": "high", "schedulerName": "default-scheduler"},
        }));
        assert_eq!(me.pod, "w-0");
        assert_eq!(me.size, Some(2));
        assert_eq!(me.priority_class.as_deref(), Some("high"));
        assert_eq!(me.scheduler_name.as_deref(), Some("default-scheduler"));
        // Empty, absent and non-string values all read as unset.
        let other = peer(json!({"metadata": {"name": "w-1"}, "spec": {"priorityClassName": "", "schedulerName": 7}}));
        assert_eq!((other.priority_class, other.scheduler_name.as_deref()), (None, Some("default-scheduler")));
        assert_eq!(peer(json!({"metadata": "w-2"})).pod, "");
        // Keys with '/' or '~' are not paths here: only these fields are read.
        let odd = peer(json!({"metadata": {"name": "a~1b/c"}, "spec": {"schedulerName": "x/y"}}));
        assert_eq!((odd.pod.as_str(), odd.scheduler_name.as_deref()), ("a~1b/c", Some("x/y")));
    }

    #[test]
    fn a_pod_naming_no_priority_class_has_the_global_default() {
        let gang = Membership { name: "g".into(), size: Some(2), source: Source::Explicit };
        let of = |pod: serde_json::Value, global: Option<&str>| Peer::of(&pod, &gang, global).priority_class;
        assert_eq!(of(json!({"spec": {}}), Some("low")).as_deref(), Some("low"));
        assert_eq!(of(json!({"spec": {"priorityClassName": ""}}), Some("low")).as_deref(), Some("low"));
        assert_eq!(of(json!({"spec": {"priorityClassName": "high"}}), Some("low")).as_deref(), Some("high"));
        assert_eq!(of(json!({"spec": {}}), None), None, "no global default: no class");
        let unset = Peer::of(&json!({"metadata": {"name": "a"}}), &gang, Some("low"));
        let named =
            Peer::of(&json!({"metadata": {"name": "b"}, "spec": {"priorityClassName": "low"}}), &gang, Some("low"));
        assert_eq!(disagreement("ns/g", &unset, &[named]), None);
    }

    #[test]
    fn members_disagreeing_on_the_scheduler_are_named() {
        let me = peer(json!({"metadata": {"name": "w-0"}, "spec": {"schedulerName": "volcano"}}));
        let other = peer(json!({"metadata": {"name": "w-1"}, "spec": {}}));
        let message = disagreement("ns/g", &me, &[other]).expect("a disagreement");
        assert_eq!(
            message,
            "gang ns/g: this pod has schedulerName volcano, member w-1 has default-scheduler; all members of a gang must agree"
        );
        // The default scheduler named or not is the same: the API server names it on every pod.
        let named = peer(json!({"metadata": {"name": "w-2"}, "spec": {"schedulerName": "default-scheduler"}}));
        let unnamed = peer(json!({"metadata": {"name": "w-3"}, "spec": {}}));
        assert_eq!(disagreement("ns/g", &named, &[unnamed]), None);
        assert_eq!(disagreement("ns/g", &me, std::slice::from_ref(&me)), None, "a pod never disagrees with itself");
    }
}
