//! Prometheus metrics, served on `--metrics-addr` at `/metrics`.
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `allot_admission_requests_total` | `webhook`, `result` (allowed/denied/mutated/error) | reviews answered |
//! | `allot_admission_decisions_total` | `webhook`, `rule`, `action` | findings per rule (deny/warn/audit) |
//! | `allot_admission_duration_seconds` | `webhook` | time to answer, body read to response |
//! | `allot_policy_reloads_total` | `result` (success/failure) | policy reload attempts |
//! | `allot_policy_set_info` | `version` | 1 for the loaded policy set's hash |
//! | `allot_policy_load_errors` | | errors in the last failed reload, 0 once a reload succeeds |
//! | `allot_certificate_reloads_total` | `result` | certificate reload attempts |

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

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
pub struct VersionLabels {
    pub version: String,
}

fn latency_histogram() -> Histogram {
    // 10 µs … ~1.3 s: admission answers in microseconds; anything near a second is an incident.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.000_01, 2.0, 18))
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
    current_version: Mutex<Option<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("allot");
        let requests = Family::<RequestLabels, Counter>::default();
        let decisions = Family::<DecisionLabels, Counter>::default();
        let duration = Family::<WebhookLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        let policy_reloads = Family::<ResultLabels, Counter>::default();
        let policy_set_info = Family::<VersionLabels, Gauge>::default();
        let policy_load_errors = Gauge::default();
        let certificate_reloads = Family::<ResultLabels, Counter>::default();
        registry.register("admission_requests", "AdmissionReviews answered", requests.clone());
        registry.register("admission_decisions", "Findings per rule and action", decisions.clone());
        registry.register("admission_duration_seconds", "Time to answer an AdmissionReview", duration.clone());
        registry.register("policy_reloads", "Policy reload attempts", policy_reloads.clone());
        registry.register("policy_set_info", "Hash of the policy set in force", policy_set_info.clone());
        registry.register("policy_load_errors", "Errors in the last failed policy reload", policy_load_errors.clone());
        registry.register("certificate_reloads", "Serving certificate reload attempts", certificate_reloads.clone());
        Metrics {
            registry,
            requests,
            decisions,
            duration,
            policy_reloads,
            policy_set_info,
            policy_load_errors,
            certificate_reloads,
            current_version: Mutex::new(None),
        }
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

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
