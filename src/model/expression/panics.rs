//! Panics at the evaluation boundary: a bug in the CEL interpreter (or one of its functions)
//! reached by some expression must cost one rule's verdict, not the request, the connection or
//! the CLI run.
//!
//! [`contain`] runs one evaluation under `catch_unwind`. A panic becomes an
//! [`EvalError::Panic`](super::EvalError), is counted in `allot_rule_evaluation_panics_total{rule}`
//! ([`RULE_PANICS`]) and is logged once per rule name. [`install_hook`] (called by `main`) makes
//! the panic hook quiet inside that boundary and turns every other panic into one log line,
//! instead of a message and backtrace on stderr for every request.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{LazyLock, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// Labels of [`RULE_PANICS`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: String,
}

/// Evaluations that panicked, per rule (`Rule` name or `placement/<name>`), since the process
/// started. Process-wide so the server's registry and every policy set (reloads included) share
/// one monotonic counter.
pub static RULE_PANICS: LazyLock<Family<RuleLabels, Counter>> = LazyLock::new(Family::default);

/// Rule names whose panic was already logged.
static LOGGED: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

thread_local! {
    /// True while this thread is inside [`contain`]: the hook records instead of printing.
    static CONTAINED: Cell<bool> = const { Cell::new(false) };
    /// The message and location the hook saw for the last contained panic.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic caught by [`contain`]: its message and, when the hook saw it, its location.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ContainedPanic {
    pub message: String,
}

impl ContainedPanic {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        "panic"
    }
}

/// Runs `evaluate` for `rule`; a panic comes back as [`ContainedPanic`], counted and logged once.
pub fn contain<T>(rule: &dyn std::fmt::Display, evaluate: impl FnOnce() -> T) -> Result<T, ContainedPanic> {
    let was_contained = CONTAINED.replace(true);
    let result = catch_unwind(AssertUnwindSafe(evaluate));
    CONTAINED.set(was_contained);
    result.map_err(|payload| {
        let message = LAST_PANIC.take().unwrap_or_else(|| payload_text(payload.as_ref()));
        record(&rule.to_string(), &message);
        ContainedPanic { message }
    })
}

/// Counts a panic of `rule` and logs it the first time this rule panics.
fn record(rule: &str, message: &str) {
    RULE_PANICS.get_or_create(&RuleLabels { rule: rule.to_string() }).inc();
    let first = LOGGED.lock().unwrap_or_else(|e| e.into_inner()).insert(rule.to_string());
    if first {
        tracing::error!(
            rule,
            panic = message,
            "rule evaluation panicked; the rule's error handling applies (Deny rules deny, Warn and Audit \
             rules warn); logged once per rule, counted in allot_rule_evaluation_panics_total"
        );
    }
}

/// The text of a panic payload (`panic!("…")` carries a `&str` or a `String`).
pub fn payload_text(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-text payload".to_string())
}

/// Replaces the default panic hook (a message, and with `RUST_BACKTRACE` a backtrace, on
/// stderr): inside [`contain`] the panic is only recorded for the boundary to report once;
/// elsewhere it becomes one `error` log line (with the backtrace when `RUST_BACKTRACE` asks).
pub fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        let message = payload_text(info.payload());
        let location = info.location().map(|l| l.to_string()).unwrap_or_default();
        if CONTAINED.get() {
            LAST_PANIC.set(Some(format!("{message} (at {location})")));
            return;
        }
        let backtrace = std::backtrace::Backtrace::capture();
        match backtrace.status() {
            std::backtrace::BacktraceStatus::Captured => {
                tracing::error!(panic = %message, %location, %backtrace, "panic")
            }
            _ => tracing::error!(panic = %message, %location, "panic"),
        }
    }));
}
