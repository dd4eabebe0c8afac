//! Where log lines go, and how a slow log reader is kept off the admission path.
//!
//! `allot serve` logs a line per Deny/Warn/Audit finding. Written straight to stderr, each line
//! was a `write` on the thread answering the review (~5 % of the server's CPU when every review
//! warns), and a log pipe nobody drained (a stalled collector, a full node disk) blocked that
//! thread: admission stalled behind logging, which tenants drive by creating warned Pods. The
//! server's lines therefore go through a bounded queue to one writer thread, which writes them
//! in batches; when the queue is full a line is dropped and counted
//! (`allot_log_lines_dropped_total`), never waited for. One-shot commands write directly, so
//! their log lines stay in order with what they print.

use std::io::{BufWriter, Stderr};
use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};

/// Lines the queue holds before new ones are dropped: minutes of a busy server's findings,
/// a few MB at most.
pub const QUEUED_LINES: usize = 16_384;

/// The log format on stderr.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per event, for log shippers.
    Json,
}

/// How lines reach stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// Written by the logging thread itself, in order: one-shot commands.
    Direct,
    /// Queued for a writer thread, dropped (and counted) when the queue is full: the server.
    Queued,
}

/// Keeps the writer thread running; dropping it writes out what is queued.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard(#[allow(dead_code)] Option<WorkerGuard>);

static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Installs the process's log subscriber (the level from `RUST_LOG`, `info` by default).
/// Colours only on a terminal: `kubectl logs` and log shippers get plain text.
pub fn init(format: LogFormat, destination: Destination) -> LogGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi);
    match destination {
        Destination::Direct => {
            let builder = builder.with_writer(std::io::stderr);
            match format {
                LogFormat::Json => builder.json().init(),
                LogFormat::Text => builder.init(),
            }
            LogGuard(None)
        }
        Destination::Queued => {
            let (writer, guard) = queued(BufWriter::new(std::io::stderr()));
            let builder = builder.with_writer(writer);
            match format {
                LogFormat::Json => builder.json().init(),
                LogFormat::Text => builder.init(),
            }
            LogGuard(Some(guard))
        }
    }
}

/// The queued writer over `out`; its dropped-line count becomes [`dropped_lines`]'s (the first
/// one made in the process: there is one subscriber).
fn queued(out: BufWriter<Stderr>) -> (tracing_appender::non_blocking::NonBlocking, WorkerGuard) {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUED_LINES)
        .thread_name("allot-log-writer")
        .finish(out);
    let _ = DROPPED.set(writer.error_counter());
    (writer, guard)
}

/// Log lines dropped so far because the writer thread fell behind (0 when lines are written
/// directly).
pub fn dropped_lines() -> u64 {
    DROPPED.get().map_or(0, |counter| u64::try_from(counter.dropped_lines()).unwrap_or(u64::MAX))
}
