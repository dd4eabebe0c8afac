//! Prometheus metrics, served on `--metrics-addr` at `/metrics`.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `allot_admission_requests_total` | `webhook`, `result` (allowed/denied/mutated/error) | reviews answered |
//! | `allot_admission_decisions_total` | `webhook`, `rule`, `action` | findings per rule (deny/warn/audit) |
//! | `allot_rule_evaluation_panics_total` | `rule` | rule (or `placement/<name>` condition) evaluations that panicked and were contained |
//! | `allot_rule_evaluation_errors_total` | `rule` | evaluations that ended in an ordinary error ("could not be evaluated") |
//! | `allot_admission_duration_seconds` | `webhook` | time to answer, body read to response |
//! | `allot_policy_reloads_total` | `result` (success/failure) | policy reload attempts |
//! | `allot_policy_set_info` | `version` | 1 for the loaded policy set's hash |
//! | `allot_policy_load_errors` | | errors in the last failed reload, 0 once a reload succeeds |
//! | `allot_certificate_reloads_total` | `result` | certificate reload attempts |
//! | `allot_certificate_expiry_timestamp_seconds` | | when the serving certificate in force expires (0 until one is read) |
//! | `allot_connections_refused_total` | | webhook connections closed at once: `--max-connections` reached |
//! | `allot_connections_accepted_total` | `protocol` (h2/http/1.1/none/other) | webhook connections accepted, by the protocol their TLS handshake negotiated (the API server uses HTTP/1.1 for Service webhooks: one connection per concurrent call) |
//! | `allot_connections_open` | | webhook connections open now (TLS established) |
//! | `allot_gang_controller_leader` | | 1 on the replica holding the Lease |
//! | `allot_gangs_waiting` | `reason` | waiting gangs (leader only; every reason at 0 elsewhere) |
//! | `allot_gang_releases_total` | | gangs released |
//! | `allot_gang_wait_seconds` | | oldest member created → gang released |
//! | `allot_quota_queue_releases_total` | | pods released from a quota queue |
//! | `allot_gang_controller_passes_total` | | decision passes (leader only) |
//! | `allot_gang_controller_refused_lifts_total` | `kind` (gate/quota) | gate lifts that admission refused (Allot's own webhook allowing another identity, or a policy in the way): gangs stay gated; alert `AllotGateLiftsRefused` |
//! | `allot_gangs_waiting_for_topology` | `level` | complete gangs with a required topology level that do not fit now (leader only; the level comes from the policies) |
//! | `allot_identity_info` | `username`, `source` (api-server/flag/default) | 1 for the identity whose writes may move Allot's gates (asked of the API server at start) |
//! | `allot_gang_controller_writes_total` | `kind` (gate/condition/event/delete/arrival/evict/mark) | the controller's writes to the API, Lease aside (every kind from 0) |
//! | `allot_team_accelerators` | `team`, `resource`, `state` | accelerators requested by non-finished pods |
//! | `allot_quota_limit`, `allot_quota_used` | `team`, `resource` | a quota's limit and what counts against it |
//! | `allot_quota_borrowed`, `allot_quota_lent` | `team`, `resource` | for a team in a cohort: what it uses beyond its nominal quota, and what of its unused nominal the others use |
//! | `allot_cluster_pods`, `allot_cluster_gangs`, `allot_cluster_nodes` | | what the cluster view tracks: memory grows with these (alert well before the limit deploy/ sizes for) |
//! | `allot_log_lines_dropped_total` | | server log lines dropped because stderr was not read fast enough (the buffer holds 4 MiB; admission never waits for logging) |
//! | `allot_ready` | | 1 when `/readyz` answers 200 (set at scrape time by the same check) |
//! | `allot_gated_pods` | `gate` (gang/quota) | live pods behind Allot's gate, from the Pod watch |
//! | `allot_gate_oldest_seconds` | `gate` | age of the oldest of them (0 when none): gates are added only at CREATE |
//! | `allot_quota_ledger_{reads,commits,conflicts,decisions,failures,allowance_admissions}_total` | | the deny-mode quota ledger's work (0 where no ledger runs) |
//! | `allot_native_covers_requests_total` | `result` (split/full) | reviews on a `--native-covers` path: the native half left out, or everything evaluated (the fingerprint is not the policy set's: re-render and apply `allot compile` and `allot webhooks --native-covers`) |
//!
//! Every label value comes from a fixed set or from the policies (rule, team and resource names),
//! never from a Pod, so the number of series is bounded by the policy set.
//!
//! The team and quota gauges are computed from the Pod watch at scrape time, so every replica
//! reports the same cluster-wide values: aggregate them with `max`, not `sum`.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::control::cluster::AcceleratorUsage;
use crate::control::gang::metrics::ControllerMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub webhook: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub webhook: &'static str,
    pub rule: String,
    pub action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub webhook: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TeamAcceleratorLabels {
    pub team: String,
    pub resource: String,
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateLabels {
    pub gate: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TeamResourceLabels {
    pub team: String,
    pub resource: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IdentityLabels {
    pub username: String,
    pub source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub version: String,
}

fn latency_histogram() -> Histogram {
    // 10 µs … ~1.3 s: admission answers in microseconds; anything near a second is an incident.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.000_01, 2.0, 18))
}

/// `allot_log_lines_dropped_total`: read from the log writer at scrape time (it keeps the count).
#[derive(Debug)]
struct DroppedLogLines;

impl prometheus_client::collector::Collector for DroppedLogLines {
    fn encode(&self, mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        let dropped = prometheus_client::metrics::counter::ConstCounter::new(crate::server::logging::dropped_lines());
        let metric = encoder.encode_descriptor(
            "log_lines_dropped",
            "Log lines dropped because stderr was not read fast enough (admission never waits for logging)",
            None,
            dropped.metric_type(),
        )?;
        dropped.encode(metric)
    }
}

/// Every metric Allot exports, with the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub decisions: Family<DecisionLabels, Counter>,
    pub duration: Family<WebhookLabels, Histogram, fn() -> Histogram>,
    pub policy_reloads: Family<ResultLabels, Counter>,
    pub policy_set_info: Family<VersionLabels, Gauge>,
    pub policy_load_errors: Gauge,
    pub certificate_reloads: Family<ResultLabels, Counter>,
    /// When the serving certificate in force expires (seconds since the epoch).
    pub certificate_expiry: Gauge,
    /// Webhook connections: refused at the cap, accepted by protocol, open.
    pub connections: super::connections::ConnectionCounters,
    /// Updated by the gang controller.
    pub controller: ControllerMetrics,
    pub team_accelerators: Family<TeamAcceleratorLabels, FloatGauge>,
    pub quota_limit: Family<TeamResourceLabels, FloatGauge>,
    pub quota_used: Family<TeamResourceLabels, FloatGauge>,
    /// For teams in a cohort: what each uses beyond its nominal quota, and lends.
    pub quota_borrowed: Family<TeamResourceLabels, FloatGauge>,
    pub quota_lent: Family<TeamResourceLabels, FloatGauge>,
    /// Pods, gangs and nodes the cluster view holds (set at scrape time).
    pub cluster_pods: Gauge,
    pub cluster_gangs: Gauge,
    pub cluster_nodes: Gauge,
    /// 1 when this replica answers `/readyz` with 200 (set at scrape time).
    pub ready: Gauge,
    /// Live pods behind each of Allot's gates, and the age of the oldest (set at scrape time).
    pub gated_pods: Family<GateLabels, Gauge>,
    pub gate_oldest_seconds: Family<GateLabels, Gauge>,
    /// Reviews sent to a `--native-covers` path, by whether the native half was left out.
    pub native_covers: Family<ResultLabels, Counter>,
    /// 1 for the identity in force and where it came from ([`super::identity`]).
    pub identity_info: Family<IdentityLabels, Gauge>,
    current_version: Mutex<Option<String>>,
}

/// The gang controller's metrics (set by the leader).
fn register_controller(registry: &mut Registry, controller: &ControllerMetrics) {
    registry.register("gang_controller_leader", "1 on the replica holding the Lease", controller.leader.clone());
    registry.register("gangs_waiting", "Waiting gangs by reason (leader only)", controller.gangs_waiting.clone());
    registry.register("gang_releases", "Gangs released", controller.gang_releases.clone());
    registry.register(
        "gang_wait_seconds",
        "From a gang's oldest member's creation to its release",
        controller.gang_wait_seconds.clone(),
    );
    registry.register("quota_queue_releases", "Pods released from a quota queue", controller.quota_releases.clone());
    registry.register(
        "gang_controller_passes",
        "Decision passes of the gang controller (leader only)",
        controller.passes.clone(),
    );
    registry.register(
        "gang_controller_writes",
        "Writes of the gang controller to the API by kind, Lease renewals aside",
        controller.writes.clone(),
    );
    registry.register(
        "gangs_waiting_for_topology",
        "Complete gangs with a required topology level that do not fit now, by that level (leader only)",
        controller.gangs_waiting_for_domain.clone(),
    );
    registry.register(
        "gang_controller_refused_lifts",
        "Gate lifts of the controller that admission refused (gangs stay gated): the identity Allot's webhook allows is not the one the controller writes as, or a policy is in the way",
        controller.refused_lifts.clone(),
    );
    registry.register(
        "gang_preemptions",
        "Preemptions the gang controller carried out for waiting gangs, by the preemptor's team",
        controller.preemptions.clone(),
    );
    registry.register(
        "quota_reclaims",
        "Reclaims of quota a cohort's team lent, carried out (every victim evicted), by the lender's team",
        controller.reclaims.clone(),
    );
    registry.register(
        "evicted_pods",
        "Pods the gang controller evicted or deleted for other work, by their team and reason (Preempted, Reclaimed, GangDisrupted)",
        controller.evicted_pods.clone(),
    );
    registry.register(
        "gang_preemption_refused_evictions",
        "Evictions of a preemption that a PodDisruptionBudget or the API refused, by the preemptor's team and why (disruption_budget, refused, unanswered)",
        controller.refused_evictions.clone(),
    );
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let mut metrics = Metrics {
            registry: Registry::with_prefix("allot"),
            requests: Family::default(),
            decisions: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            policy_reloads: Family::default(),
            policy_set_info: Family::default(),
            policy_load_errors: Gauge::default(),
            certificate_reloads: Family::default(),
            certificate_expiry: Gauge::default(),
            connections: super::connections::ConnectionCounters::default(),
            controller: ControllerMetrics::default(),
            team_accelerators: Family::default(),
            quota_limit: Family::default(),
            quota_used: Family::default(),
            quota_borrowed: Family::default(),
            quota_lent: Family::default(),
            cluster_pods: Gauge::default(),
            cluster_gangs: Gauge::default(),
            cluster_nodes: Gauge::default(),
            ready: Gauge::default(),
            gated_pods: Family::default(),
            gate_oldest_seconds: Family::default(),
            native_covers: Family::default(),
            identity_info: Family::default(),
            current_version: Mutex::new(None),
        };
        metrics.register_admission();
        metrics.register_serving();
        register_controller(&mut metrics.registry, &metrics.controller);
        metrics.register_cluster_view();
        metrics.registry.register_collector(Box::new(DroppedLogLines));
        metrics
    }

    /// What admission answered and decided, and the policy set it answered with.
    fn register_admission(&mut self) {
        let registry = &mut self.registry;
        registry.register("admission_requests", "AdmissionReviews answered", self.requests.clone());
        registry.register("admission_decisions", "Findings per rule and action", self.decisions.clone());
        registry.register(
            "rule_evaluation_panics",
            "Rule evaluations that panicked (contained: the rule's error handling applied)",
            crate::model::expression::RULE_PANICS.clone(),
        );
        registry.register(
            "rule_evaluation_errors",
            "Rule evaluations that ended in an error (the rule answered \"could not be evaluated\")",
            crate::model::expression::RULE_ERRORS.clone(),
        );
        registry.register("admission_duration_seconds", "Time to answer an AdmissionReview", self.duration.clone());
        registry.register("policy_reloads", "Policy reload attempts", self.policy_reloads.clone());
        registry.register("policy_set_info", "Hash of the policy set in force", self.policy_set_info.clone());
        registry.register(
            "policy_load_errors",
            "Errors in the last failed policy reload",
            self.policy_load_errors.clone(),
        );
        // Both results from 0, so an alert on `full` has a series to rate from the start.
        for result in ["split", "full"] {
            let _ = self.native_covers.get_or_create(&ResultLabels { result });
        }
        registry.register(
            "native_covers_requests",
            "Reviews on a --native-covers path: split (the native half left out) or full (fingerprint not in force)",
            self.native_covers.clone(),
        );
        registry.register(
            "identity_info",
            "1 for the user name whose writes may move Allot's gates, by where it came from (api-server, flag, default)",
            self.identity_info.clone(),
        );
    }

    /// The serving side: certificates and webhook connections.
    fn register_serving(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "certificate_reloads",
            "Serving certificate reload attempts",
            self.certificate_reloads.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the serving certificate in force expires, in seconds since the epoch",
            self.certificate_expiry.clone(),
        );
        let connections = &self.connections;
        registry.register(
            "connections_refused",
            "Webhook connections closed at once because --max-connections were open",
            connections.refused.clone(),
        );
        registry.register(
            "connections_accepted",
            "Webhook connections accepted, by the protocol their TLS handshake negotiated",
            connections.accepted.clone(),
        );
        registry.register("connections_open", "Webhook connections open now", connections.open.clone());
    }

    /// What the cluster view holds, set at scrape time: team usage, quotas, sizes, gates.
    fn register_cluster_view(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "team_accelerators",
            "Accelerators requested by non-finished pods, per team and state",
            self.team_accelerators.clone(),
        );
        registry.register("quota_limit", "A team quota's limit, in the quota's units", self.quota_limit.clone());
        registry.register(
            "quota_used",
            "What counts against a team quota now (queued pods excluded)",
            self.quota_used.clone(),
        );
        registry.register(
            "quota_borrowed",
            "What a team in a cohort uses beyond its nominal quota, from the others' unused quota",
            self.quota_borrowed.clone(),
        );
        registry.register(
            "quota_lent",
            "What of a team's unused nominal quota the other teams of its cohort use",
            self.quota_lent.clone(),
        );
        registry.register(
            "cluster_pods",
            "Pods the cluster view tracks (memory grows with them)",
            self.cluster_pods.clone(),
        );
        registry.register("cluster_gangs", "Gangs the cluster view tracks", self.cluster_gangs.clone());
        registry.register("cluster_nodes", "Nodes the cluster view tracks", self.cluster_nodes.clone());
        registry.register("ready", "1 when this replica's /readyz answers 200", self.ready.clone());
        registry.register("gated_pods", "Live pods behind Allot's scheduling gate, by gate", self.gated_pods.clone());
        registry.register(
            "gate_oldest_seconds",
            "Age of the oldest live pod behind Allot's gate (0 when none), by gate",
            self.gate_oldest_seconds.clone(),
        );
    }

    /// Registers the deny-mode ledger's counters: the shared ledger's where it is in use, a set
    /// that stays at 0 elsewhere (so dashboards and alerts find the same names on every replica).
    pub fn register_ledger(&mut self, ledger: &crate::control::quota::shared::LedgerMetrics) {
        let r = &mut self.registry;
        r.register("quota_ledger_reads", "Reads of a deny-mode quota ledger from the API server", ledger.reads.clone());
        r.register("quota_ledger_commits", "Rounds of deny-mode charges committed to a ledger", ledger.commits.clone());
        r.register(
            "quota_ledger_conflicts",
            "Ledger writes refused with 409 (another replica wrote first; read and decided again)",
            ledger.conflicts.clone(),
        );
        r.register("quota_ledger_decisions", "Deny-mode admissions decided on a ledger", ledger.decisions.clone());
        r.register(
            "quota_ledger_failures",
            "Ledger rounds that failed closed (API server errors or the request deadline)",
            ledger.failures.clone(),
        );
        r.register(
            "quota_ledger_allowance_admissions",
            "Deny-mode admissions answered from this replica's allowance, without a round trip",
            ledger.allowance_admissions.clone(),
        );
    }

    /// Sets `allot_identity_info` (once, at start).
    pub fn set_identity(&self, username: &str, source: &'static str) {
        self.identity_info.clear();
        self.identity_info.get_or_create(&IdentityLabels { username: username.to_string(), source }).set(1);
    }

    /// Points `allot_policy_set_info` at a new version.
    pub fn set_policy_version(&self, version: &str) {
        let mut current = self.current_version.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = current.take() {
            self.policy_set_info.remove(&VersionLabels { version: old });
        }
        self.policy_set_info.get_or_create(&VersionLabels { version: version.to_string() }).set(1);
        *current = Some(version.to_string());
    }

    /// Replaces the team and quota gauges with a fresh reading (series of teams or resources
    /// that are gone disappear).
    pub fn set_usage(&self, usage: &AcceleratorUsage) {
        self.team_accelerators.clear();
        self.quota_limit.clear();
        self.quota_used.clear();
        self.quota_borrowed.clear();
        self.quota_lent.clear();
        for g in &usage.requested {
            let labels =
                TeamAcceleratorLabels { team: g.team.clone(), resource: g.resource.clone(), state: g.state.as_str() };
            self.team_accelerators.get_or_create(&labels).set(g.amount);
        }
        for q in &usage.quotas {
            let labels = TeamResourceLabels { team: q.team.clone(), resource: q.resource.clone() };
            self.quota_limit.get_or_create(&labels).set(q.limit);
            self.quota_used.get_or_create(&labels).set(q.used);
            if let Some((borrowed, lent)) = q.borrowed_lent {
                self.quota_borrowed.get_or_create(&labels).set(borrowed);
                self.quota_lent.get_or_create(&labels).set(lent);
            }
        }
    }

    /// Sets the tracked-object gauges from the cluster view's counts.
    pub fn set_tracked(&self, tracked: &crate::control::cluster::Tracked) {
        let as_gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.cluster_pods.set(as_gauge(tracked.pods));
        self.cluster_gangs.set(as_gauge(tracked.gangs));
        self.cluster_nodes.set(as_gauge(tracked.nodes));
    }

    /// Sets the gate gauges from the cluster view's reading.
    pub fn set_gates(&self, gates: &[crate::control::cluster::GateGauge]) {
        for g in gates {
            let labels = GateLabels { gate: g.gate.as_str() };
            self.gated_pods.get_or_create(&labels).set(i64::try_from(g.pods).unwrap_or(i64::MAX));
            self.gate_oldest_seconds.get_or_create(&labels).set(g.oldest_seconds);
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
