//! `allot serve`: the HTTPS webhook server. The only module that knows HTTP.
//!
//! - `POST /mutate`, `POST /validate`: AdmissionReview v1 in, AdmissionReview out (HTTP 200 with
//!   the decision inside, like every webhook); malformed input → HTTP 400 with the reason.
//! - `GET /healthz` (process alive) and `GET /readyz` (a policy set is loaded; the body says
//!   which, and the last reload error if any) on both the webhook and the metrics address.
//! - `GET /metrics` on the metrics address (plain HTTP).
//!
//! Bounded: request bodies over `--max-body-bytes` get 413; a request not answered within
//! `--request-timeout` gets 503, well before the API server's `timeoutSeconds`.

pub mod connections;
pub mod device_classes;
pub mod identity;
pub mod logging;
pub mod metrics;
pub mod pod_groups;
mod process;
pub mod reload;
pub mod startup;
pub mod tls;

pub use process::run;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::timeout::TimeoutLayer;

use crate::admission::covers::NativeSplit;
use crate::admission::engine::Engine;
use crate::admission::quota::QuotaBook;
use crate::admission::reserve::{DeferringBook, Unreserved};
use crate::admission::{self, Phase};
use crate::control::cluster::ClusterState;
use crate::control::quota::{LiveQuota, SharedLedger};
use crate::model::clock::unix_now;
use crate::model::namespaces::NamespaceLabels;
use crate::model::policy::{self, Action, PolicySet};
use metrics::{DecisionLabels, Metrics, RequestLabels, WebhookLabels};
use startup::{Caches, StartingQuota};

/// Settings of `allot serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub policies: PathBuf,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// When set, clients must present a certificate from this CA (PEM): the API server's.
    pub client_ca: Option<PathBuf>,
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    /// Reviews up to this size are evaluated in place when every policy expression is linear
    /// (0: always on the blocking pool); see `Evaluations`.
    pub inline_body_bytes: usize,
    /// A connection must send a complete request head within this; on HTTP/1.1 keep-alive the
    /// timer also runs while the connection waits for its next request (hyper starts it then).
    pub header_read_timeout: Duration,
    /// Most webhook connections open at once; more are closed at accept.
    pub max_connections: usize,
    /// Fallback poll for changed policy and certificate files (file events are the fast path).
    pub reload_interval: Duration,
    /// How long in-flight requests may take to finish on SIGTERM.
    pub shutdown_grace: Duration,
    /// Use the Kubernetes API when a kubeconfig or in-cluster config is available: the
    /// Namespace watch (Team selectors) and the gang controller.
    pub use_kube: bool,
    /// Run the gang controller (leader-elected) when the API is available.
    pub gang_controller: Option<crate::control::gang::controller::ControllerConfig>,
    /// `--allot-username`: Allot's own user name in AdmissionReviews (the only one that may move
    /// its gates and reserved keys on Pod UPDATE) where the API server cannot be asked; where it
    /// can, it must agree with the API server's answer ([`identity`]).
    pub allot_username: Option<String>,
}

/// The state requests read: swapped whole on reload, never locked on the hot path.
pub struct AppState {
    pub policies: Arc<ArcSwap<PolicySet>>,
    pub namespaces: Arc<dyn NamespaceLabels>,
    /// The controller's Pod and Node watch: existing gang members for admission, and the team
    /// and quota gauges.
    pub cluster: Arc<ClusterState>,
    /// Deny-mode quota usage and reservations.
    pub quota: Arc<dyn QuotaBook>,
    /// The API server's shared ledger, when deny-mode quota is decided there: evaluation then
    /// only records the charge ([`DeferringBook`]) and the engine's reservation step
    /// ([`Unreserved::reserve`], run by [`finish`]) awaits it without holding a thread.
    pub ledger: Option<Arc<SharedLedger>>,
    /// The watches quota depends on; until they have synced, quota fails closed and `/readyz`
    /// says not ready. Nothing is required unless marked (no Kubernetes API: nothing to wait for).
    pub caches: Arc<Caches>,
    pub metrics: Metrics,
    /// The last reload error, shown on `/readyz` while the last good set stays in force.
    pub last_reload_error: ArcSwap<Option<String>>,
    pub shutting_down: AtomicBool,
    /// Allot's own user name (see [`ServeConfig::allot_username`]).
    pub allot_username: String,
    /// The webhook's share of the policy set beside its native policies, for reviews on a
    /// `--native-covers` path ([`crate::admission::covers`]); used only while its version is in force.
    pub native_split: arc_swap::ArcSwapOption<NativeSplit>,
    /// Where DRA claims are resolved: the claim watches, once started ([`AppState::watch_claims`]);
    /// until then (and without a Kubernetes API) no claim is known, and a pod naming one whose
    /// DeviceClass the policies map is denied.
    pub claims: std::sync::OnceLock<Arc<dyn crate::model::dra::ClaimSource>>,
    /// What the policy set is compiled with from the cluster (its DeviceClasses' extended
    /// resources, [`device_classes`]); a change wakes the reloader ([`AppState::facts_changed`]).
    pub cluster_facts: ArcSwap<policy::ClusterFacts>,
    pub facts_changed: tokio::sync::Notify,
    /// The DeviceClass watch has listed once (or given up waiting): the reloader then marks
    /// [`Caches::device_classes`] synced once a set compiled with the facts is in force.
    pub facts_listed: AtomicBool,
}

impl AppState {
    /// State over a loaded policy set.
    pub fn new(policies: PolicySet, namespaces: Arc<dyn NamespaceLabels>) -> Arc<AppState> {
        AppState::with_cluster(policies, namespaces, Arc::new(ClusterState::default()))
    }

    /// State whose admission checks gang members and quotas against `cluster` (the
    /// controller's watch; empty without a Kubernetes API).
    pub fn with_cluster(
        policies: PolicySet,
        namespaces: Arc<dyn NamespaceLabels>,
        cluster: Arc<ClusterState>,
    ) -> Arc<AppState> {
        AppState::with_identity(
            policies,
            namespaces,
            cluster,
            crate::admission::tenant::DEFAULT_ALLOT_USERNAME.to_string(),
        )
    }

    /// [`AppState::with_cluster`], with Allot's own user name.
    pub fn with_identity(
        policies: PolicySet,
        namespaces: Arc<dyn NamespaceLabels>,
        cluster: Arc<ClusterState>,
        allot_username: String,
    ) -> Arc<AppState> {
        AppState::with_caches(policies, namespaces, cluster, Arc::new(Caches::default()), allot_username)
    }

    /// State whose quota answers wait for `caches` (the watches that fill `cluster` and
    /// `namespaces` report to it).
    pub fn with_caches(
        policies: PolicySet,
        namespaces: Arc<dyn NamespaceLabels>,
        cluster: Arc<ClusterState>,
        caches: Arc<Caches>,
        allot_username: String,
    ) -> Arc<AppState> {
        AppState::with_ledger(policies, namespaces, cluster, caches, allot_username, None)
    }

    /// [`AppState::with_caches`], with deny-mode quota decided on `ledger` (the API server's
    /// shared ledger) instead of this replica's own view when given.
    pub fn with_ledger(
        policies: PolicySet,
        namespaces: Arc<dyn NamespaceLabels>,
        cluster: Arc<ClusterState>,
        caches: Arc<Caches>,
        allot_username: String,
        ledger: Option<Arc<SharedLedger>>,
    ) -> Arc<AppState> {
        let mut metrics = Metrics::new();
        metrics.set_policy_version(&policies.version);
        match &ledger {
            Some(ledger) => metrics.register_ledger(&ledger.metrics),
            None => metrics.register_ledger(&crate::control::quota::shared::LedgerMetrics::default()),
        }
        let policies = Arc::new(ArcSwap::from_pointee(policies));
        let book: Arc<dyn QuotaBook> = match &ledger {
            Some(_) => Arc::new(CommittedAfterEvaluation),
            None => Arc::new(LiveQuota::new(cluster.clone(), policies.clone(), namespaces.clone())),
        };
        Arc::new(AppState {
            quota: Arc::new(StartingQuota { inner: book, caches: caches.clone() }),
            ledger,
            caches,
            policies,
            namespaces,
            cluster,
            metrics,
            last_reload_error: ArcSwap::from_pointee(None),
            shutting_down: AtomicBool::new(false),
            allot_username,
            native_split: arc_swap::ArcSwapOption::empty(),
            claims: std::sync::OnceLock::new(),
            cluster_facts: ArcSwap::from_pointee(policy::ClusterFacts::default()),
            facts_changed: tokio::sync::Notify::new(),
            facts_listed: AtomicBool::new(false),
        })
    }

    /// Computes the `--native-covers` split of the policy set compiled from `sources` (before
    /// or after it is swapped in: a request uses a split only while its version is in force).
    /// A failure leaves no split: covered paths then evaluate everything.
    pub fn set_native_split(&self, sources: &[policy::Source]) {
        match NativeSplit::from_sources_with(sources, &self.cluster_facts.load()) {
            Ok(split) => {
                tracing::info!(version = %split.version, fingerprint = %split.fingerprint, covered = ?split.covered.describe(), "native policies' share computed");
                self.native_split.store(Some(Arc::new(split)));
            }
            Err(e) => {
                tracing::warn!(error = %e, "no --native-covers split: reviews on a native path evaluate everything");
                self.native_split.store(None);
            }
        }
    }
}

/// The webhook router with its limits (no TLS): what in-process tests call with `oneshot`.
/// The deadline covers reading the body too, so a client that stalls mid-body is cut off.
pub fn router(state: Arc<AppState>, max_body_bytes: usize, request_timeout: Duration) -> Router {
    router_with_inline_limit(state, max_body_bytes, request_timeout, DEFAULT_INLINE_BODY_BYTES)
}

/// Largest AdmissionReview evaluated in place (see [`Evaluations`]) by default.
pub const DEFAULT_INLINE_BODY_BYTES: usize = 16 * 1024;

/// [`router`], evaluating reviews of at most `inline_body_bytes` in place when every rule and
/// placement condition is linear (0: always on the blocking pool).
pub fn router_with_inline_limit(
    state: Arc<AppState>,
    max_body_bytes: usize,
    request_timeout: Duration,
    inline_body_bytes: usize,
) -> Router {
    let evaluations = Evaluations::new(request_timeout, inline_body_bytes);
    // `/PHASE` evaluates the whole policy set; `/PHASE/native/FINGERPRINT` (`allot webhooks
    // --native-covers`) leaves out what native policies of that fingerprint do.
    let phase_route = |phase: Phase| {
        let plain = evaluations.clone();
        let native = evaluations.clone();
        (
            post(move |State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>| async move {
                match body {
                    Ok(body) => plain.clone().run(state, phase, None, body).await,
                    Err(rejection) => unreadable_body(&rejection, max_body_bytes),
                }
            }),
            post(
                move |State(state): State<Arc<AppState>>,
                      Path(fingerprint): Path<String>,
                      body: Result<Bytes, BytesRejection>| async move {
                    match body {
                        Ok(body) => native.clone().run(state, phase, Some(fingerprint), body).await,
                        Err(rejection) => unreadable_body(&rejection, max_body_bytes),
                    }
                },
            ),
        )
    };
    let (mutate, mutate_native) = phase_route(Phase::Mutate);
    let (validate, validate_native) = phase_route(Phase::Validate);
    Router::new()
        .route("/mutate", mutate)
        .route("/mutate/native/{fingerprint}", mutate_native)
        .route("/validate", validate)
        .route("/validate/native/{fingerprint}", validate_native)
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, request_timeout))
        .with_state(state)
}

/// The metrics router: `/metrics`, plus the probes.
pub fn metrics_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// The answer to a body that could not be read (over `--max-body-bytes`, or broken off): the
/// HTTP status of the rejection with a `metav1.Status` body. The uid is unknown, so no
/// AdmissionReview can be answered; the API server's client decodes a Status, so the person who
/// ran `kubectl apply` reads why instead of "responded with the status code 413 but did not
/// return more information".
fn unreadable_body(rejection: &BytesRejection, max_body_bytes: usize) -> Response {
    let code = rejection.status();
    let (reason, message) = if code == StatusCode::PAYLOAD_TOO_LARGE {
        (
            "RequestEntityTooLarge",
            format!(
                "allot: this AdmissionReview is larger than the {max_body_bytes} bytes Allot reads \
                 (allot serve --max-body-bytes); the object is too large to be reviewed"
            ),
        )
    } else {
        ("BadRequest", format!("allot: the AdmissionReview body could not be read: {}", rejection.body_text()))
    };
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, [(header::CONTENT_TYPE, "application/json")], status.to_string()).into_response()
}

/// Runs evaluations off the async workers, a bounded number at a time, each within the request
/// deadline.
///
/// CEL cannot be interrupted once it runs, and a rule over a large object can take seconds. On
/// an async worker that would stall every other request on the worker (probes included) and the
/// deadline could not fire until it returned. On the blocking pool a runaway evaluation costs
/// one thread; the caller gets 503 at the deadline (the API server then applies the webhook's
/// failurePolicy) while the evaluation finishes in the background, and at most `permits`
/// evaluations run at once, so a burst of them cannot take every core either.
///
/// The fast path: handing a review to the pool and back costs two thread wake-ups, more than
/// evaluating a small Pod. When the body is at most `inline_body_bytes` and every expression in
/// the policy set is linear ([`crate::model::expression::Expression::is_linear`]: no nested or
/// accumulating comprehension, no regular expression), the evaluation's cost is bounded by the
/// body's size (one comprehension over a list, each step at most linear: quadratic in 16 KiB at
/// worst, milliseconds; tens of microseconds for a Pod) and it runs in place, still under the
/// panic boundary.
#[derive(Clone)]
struct Evaluations {
    permits: Arc<tokio::sync::Semaphore>,
    deadline: Duration,
    inline_body_bytes: usize,
}

impl Evaluations {
    /// `request_timeout` also covers reading the body (the outer layer, which answers a bare
    /// 503): evaluation gets 90% of it, so that when the body came quickly a slow evaluation
    /// is answered here, with the reason and counted, rather than by the outer layer.
    fn new(request_timeout: Duration, inline_body_bytes: usize) -> Evaluations {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Evaluations {
            permits: Arc::new(tokio::sync::Semaphore::new(cores * 2)),
            deadline: request_timeout - request_timeout / 10,
            inline_body_bytes,
        }
    }

    async fn run(self, state: Arc<AppState>, phase: Phase, native: Option<String>, body: Bytes) -> Response {
        if body.len() <= self.inline_body_bytes && state.policies.load().linear {
            let evaluated = evaluate_contained(&state, phase, native.as_deref(), &body, None);
            return finish(&state, evaluated).await;
        }
        let webhook = phase.label();
        let deadline = self.deadline;
        let metrics = state.clone();
        let evaluation = async move {
            // Waiting for a permit counts against the deadline: a queue behind runaway
            // evaluations ends in 503, not in a late answer. The permit covers the evaluation
            // only, not the wait for a deferred ledger commit.
            let permit = self.permits.acquire_owned().await;
            let evaluating = state.clone();
            let evaluated = tokio::task::spawn_blocking(move || {
                evaluate_contained(&evaluating, phase, native.as_deref(), &body, permit.ok())
            })
            .await?;
            Ok::<_, tokio::task::JoinError>(finish(&state, evaluated).await)
        };
        match tokio::time::timeout(deadline, evaluation).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                tracing::error!(webhook, error = %e, "evaluation failed");
                (StatusCode::INTERNAL_SERVER_ERROR, "allot: evaluation failed; see the server log\n").into_response()
            }
            Err(_) => {
                metrics.metrics.requests.get_or_create(&RequestLabels { webhook, result: "error" }).inc();
                tracing::warn!(webhook, ?deadline, "evaluation did not finish within the request deadline");
                let message = format!(
                    "allot: {webhook} evaluation did not finish within the {deadline:?} request deadline (a Rule is \
                     too expensive for this object, or the server is overloaded)\n"
                );
                (StatusCode::SERVICE_UNAVAILABLE, message).into_response()
            }
        }
    }
}

/// `AppState::quota` beside the shared ledger: its charges are recorded during evaluation
/// ([`DeferringBook`]) and reserved by [`Unreserved::reserve`], never decided by a synchronous
/// book (which would hold a thread per admission while it waits on the API server). Asked
/// anyway, it refuses: failing closed.
struct CommittedAfterEvaluation;

impl QuotaBook for CommittedAfterEvaluation {
    fn admit(
        &self,
        _: &crate::model::policy::quota::Quota,
        _: &crate::admission::quota::QuotaRequest<'_>,
    ) -> Result<(), crate::admission::quota::Refusal> {
        Err(crate::admission::quota::Refusal::Unknown {
            reason: "internal error: a deny-mode charge reached the synchronous book instead of the shared ledger"
                .into(),
        })
    }
}

/// What evaluating a review gave: a response already, or an answer still to be settled
/// (deferred ledger charges) and reported.
enum Evaluated {
    /// Answered already: a malformed review, or a panic.
    Answered(Response),
    Review {
        webhook: &'static str,
        started: Instant,
        review: Box<Unreserved>,
    },
}

/// [`evaluate`], with any panic turned into a well-formed AdmissionReview error (HTTP 200,
/// `allowed: false`, status 500, the request's uid) instead of a dropped connection. Rule
/// evaluations contain their own panics; this is the last line for everything else.
fn evaluate_contained(
    state: &AppState,
    phase: Phase,
    native: Option<&str>,
    body: &[u8],
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Evaluated {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| evaluate(state, phase, native, body, permit)))
        .unwrap_or_else(|payload| {
            let message = crate::model::expression::panics::payload_text(payload.as_ref());
            Evaluated::Answered(panicked(state, phase, admission::internal_error_response(body, &message), &message))
        })
}

/// Counts and logs a panic while answering a review; `error_review` is the error answer.
fn panicked(state: &AppState, phase: Phase, error_review: Vec<u8>, message: &str) -> Response {
    let webhook = phase.label();
    state.metrics.requests.get_or_create(&RequestLabels { webhook, result: "error" }).inc();
    tracing::error!(webhook, panic = %message, "answering an AdmissionReview panicked; answered with an error");
    ([(header::CONTENT_TYPE, "application/json")], error_review).into_response()
}

/// Decodes and evaluates a review (synchronous: CPU only). With the shared ledger, deny-mode
/// charges are only recorded here; [`finish`] commits them.
fn evaluate(
    state: &AppState,
    phase: Phase,
    native: Option<&str>,
    body: &[u8],
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Evaluated {
    let started = Instant::now();
    let webhook = phase.label();
    let policies = state.policies.load();
    let split = native.and_then(|fingerprint| {
        let split = state.native_split.load_full().filter(|s| s.applies(&policies.version, fingerprint) && s.takes(body));
        let result = if split.is_some() { "split" } else { "full" };
        state.metrics.native_covers.get_or_create(&metrics::ResultLabels { result }).inc();
        if split.is_none() {
            tracing::debug!(webhook, fingerprint, version = %policies.version, "no split for this review (native policies of another policy set, or a review naming DRA claims): evaluating everything");
        }
        split
    });
    let in_force: &PolicySet = match (&split, phase) {
        (Some(split), Phase::Mutate) => &split.mutate,
        (Some(split), Phase::Validate) => &split.validate,
        (None, _) => &policies,
    };
    let deferring = DeferringBook::default();
    let deferred_book = StartingQuota { inner: &deferring, caches: state.caches.clone() };
    let book: &dyn QuotaBook = if state.ledger.is_some() { &deferred_book } else { state.quota.as_ref() };
    let engine = Engine::new(in_force, state.namespaces.as_ref())
        .with_gangs(state.cluster.as_ref())
        .with_quota(book)
        .with_allot_username(&state.allot_username)
        .with_claims(
            state
                .claims
                .get()
                .map_or(&crate::model::dra::NoClaims as &dyn crate::model::dra::ClaimSource, |c| c.as_ref()),
        )
        // The changes are only logged, at debug level ("mutated"): not formatted otherwise.
        .with_change_descriptions(tracing::enabled!(tracing::Level::DEBUG));
    match admission::review(body, phase, &engine) {
        Ok(answer) => Evaluated::Review { webhook, started, review: Box::new(Unreserved::new(answer, deferring)) },
        Err(e) => {
            state.metrics.requests.get_or_create(&RequestLabels { webhook, result: "error" }).inc();
            tracing::warn!(webhook, error = %e, "rejected malformed AdmissionReview");
            state.metrics.duration.get_or_create(&WebhookLabels { webhook }).observe(started.elapsed().as_secs_f64());
            Evaluated::Answered((StatusCode::BAD_REQUEST, format!("{e}\n")).into_response())
        }
    }
}

/// Runs the engine's last step, the reservation of its deferred quota charges on the shared
/// ledger (awaiting the API server without holding a thread), then counts, logs and sends the
/// answer.
async fn finish(state: &AppState, evaluated: Evaluated) -> Response {
    use futures::FutureExt;
    let (webhook, started, review) = match evaluated {
        Evaluated::Answered(response) => return response,
        Evaluated::Review { webhook, started, review } => (webhook, started, review),
    };
    let answer = match state.ledger.as_ref().filter(|_| review.has_charges()) {
        Some(ledger) => {
            let uid = review.uid().to_string();
            match std::panic::AssertUnwindSafe(review.reserve(ledger.as_ref())).catch_unwind().await {
                Ok(answer) => answer,
                Err(payload) => {
                    let message = crate::model::expression::panics::payload_text(payload.as_ref());
                    return panicked(state, Phase::Validate, admission::internal_error_for(&uid, &message), &message);
                }
            }
        }
        None => review.without_reserving(),
    };
    let result = match (answer.allowed, answer.mutated) {
        (false, _) => "denied",
        (true, true) => "mutated",
        (true, false) => "allowed",
    };
    state.metrics.requests.get_or_create(&RequestLabels { webhook, result }).inc();
    for f in &answer.outcome.findings {
        state
            .metrics
            .decisions
            .get_or_create(&DecisionLabels { webhook, rule: f.rule.to_string(), action: f.action.label() })
            .inc();
        let message = f.describe();
        match f.action {
            Action::Deny => {
                tracing::info!(webhook, uid = %answer.uid, kind = %answer.kind, namespace = %answer.namespace, name = %answer.name, rule = %f.rule, %message, "denied")
            }
            Action::Warn | Action::Audit => {
                tracing::info!(webhook, uid = %answer.uid, kind = %answer.kind, namespace = %answer.namespace, name = %answer.name, rule = %f.rule, action = f.action.label(), %message, "flagged")
            }
        }
    }
    if answer.mutated {
        tracing::debug!(webhook, uid = %answer.uid, namespace = %answer.namespace, name = %answer.name, changes = ?answer.outcome.changes, "mutated");
    }
    for note in &answer.outcome.notes {
        tracing::warn!(webhook, uid = %answer.uid, namespace = %answer.namespace, name = %answer.name, %note, "incomplete evaluation");
    }
    state.metrics.duration.get_or_create(&WebhookLabels { webhook }).observe(started.elapsed().as_secs_f64());
    ([(header::CONTENT_TYPE, "application/json")], answer.body).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Why `/readyz` answers 503.
#[derive(Debug, thiserror::Error)]
enum NotReady {
    #[error("shutting down\n")]
    ShuttingDown,
    /// A cache admission needs has not synced yet.
    #[error("not ready: {0}\n")]
    Starting(String),
}

impl NotReady {
    /// A short, stable name for the reason (metrics, logs).
    fn metric_label(&self) -> &'static str {
        match self {
            NotReady::ShuttingDown => "shutting_down",
            NotReady::Starting(_) => "starting",
        }
    }
}

/// What `/readyz` answers: `Ok(body)` for 200, `Err` for 503. One function, so the
/// `allot_ready` gauge says exactly what the probe does.
fn readiness(state: &AppState) -> Result<String, NotReady> {
    if state.shutting_down.load(Ordering::Relaxed) {
        return Err(NotReady::ShuttingDown);
    }
    if let Some(reason) = state.caches.starting_reason() {
        return Err(NotReady::Starting(reason));
    }
    let policies = state.policies.load();
    let counts: Vec<String> = policies.summary().iter().map(|(k, v)| format!("{v} {k}")).collect();
    let mut body = format!("ok: policy set {} ({})\n", policies.version, counts.join(", "));
    if let Some(error) = state.last_reload_error.load().as_ref() {
        body.push_str(&format!("last reload failed; still serving {}:\n{error}\n", policies.version));
    }
    Ok(body)
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    match readiness(&state) {
        Ok(body) => body.into_response(),
        Err(not_ready) => {
            tracing::debug!(reason = not_ready.metric_label(), "not ready");
            (StatusCode::SERVICE_UNAVAILABLE, not_ready.to_string()).into_response()
        }
    }
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    // Read from the watch at scrape time: one pass over the pod records per scrape.
    state.metrics.set_usage(&state.cluster.accelerator_usage(&state.policies.load(), state.namespaces.as_ref()));
    state.metrics.set_tracked(&state.cluster.tracked());
    state.metrics.set_gates(&state.cluster.gate_gauges(unix_now()));
    state.metrics.ready.set(i64::from(readiness(&state).is_ok()));
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.encode())
        .into_response()
}
