//! Where log lines go, and how a slow log reader is kept off the admission path.
//!
//! `allot serve` logs a line per Deny/Warn/Audit finding. Written straight to stderr, each line
//! was a `write` on the thread answering the review, and a log pipe nobody drained (a stalled
//! collector, a full node disk) blocked that thread: admission stalled behind logging, which
//! tenants drive by creating warned Pods. The server's lines therefore go to a bounded buffer
//! ([`Batched`]) that one writer thread empties in batches; when the buffer is full a line is
//! dropped and counted (`allot_log_lines_dropped_total`), never waited for. One-shot commands
//! write directly, so their log lines stay in order with what they print.
//!
//! Batches, not a queue of lines: a writer thread woken for every line (tracing-appender's
//! design, tried first) cost more than the direct `write` it replaced at 2,000 reviews/s (a
//! futex wake and two context switches per line on 2 shared cores: 121–140 µs of server CPU per
//! review against 88–105 direct and 78–83 with no line). Here the first line into an empty
//! buffer wakes the writer, which then waits [`GATHER`] for more before writing them at once.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, mpsc};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// Bytes of log lines the buffer holds before new lines are dropped: minutes of a busy
/// server's findings.
pub const BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// How long the writer lets lines gather after the first one: a line reaches stderr at most
/// this late (plus the write itself).
pub const GATHER: Duration = Duration::from_millis(20);

/// How long dropping the guard waits for the writer to write out what is buffered: a stderr
/// that never drains must not keep the process from exiting.
const FINAL_FLUSH: Duration = Duration::from_secs(2);

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
    /// Buffered for a writer thread, dropped (and counted) when the buffer is full: the server.
    Batched,
}

/// Keeps the writer thread running; dropping it writes out what is buffered (waiting at most
/// [`FINAL_FLUSH`]).
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    _writer: Option<WriterGuard>,
}

/// The server's buffer, for [`dropped_lines`] (there is one subscriber per process).
static BATCHED: OnceLock<Arc<Shared>> = OnceLock::new();

/// Installs the process's log subscriber (the level from `RUST_LOG`, `info` by default).
/// Colours only on a terminal: `kubectl logs` and log shippers get plain text.
pub fn init(format: LogFormat, destination: Destination) -> LogGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = io::IsTerminal::is_terminal(&io::stderr());
    let (lines, guard) = match destination {
        Destination::Direct => (Lines::Direct, None),
        Destination::Batched => {
            let (writer, guard) = batched(io::stderr(), BUFFER_BYTES, GATHER);
            let _ = BATCHED.set(writer.shared.clone());
            (Lines::Batched(writer), Some(guard))
        }
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(lines);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    LogGuard { _writer: guard }
}

/// Where the subscriber's lines go, per [`Destination`].
enum Lines {
    Direct,
    Batched(Batched),
}

/// One event's writer: stderr itself, or the buffer (borrowed: nothing is cloned per event).
enum LineWriter<'a> {
    Direct(io::Stderr),
    Batched(&'a Batched),
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        match self {
            Lines::Direct => LineWriter::Direct(io::stderr()),
            Lines::Batched(batched) => LineWriter::Batched(batched),
        }
    }
}

impl Write for LineWriter<'_> {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        match self {
            LineWriter::Direct(stderr) => stderr.write(line),
            LineWriter::Batched(batched) => {
                batched.append(line);
                Ok(line.len())
            }
        }
    }

    fn write_all(&mut self, line: &[u8]) -> io::Result<()> {
        match self {
            // Stderr's own write_all holds its lock for the whole line.
            LineWriter::Direct(stderr) => stderr.write_all(line),
            LineWriter::Batched(batched) => {
                batched.append(line);
                Ok(())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            LineWriter::Direct(stderr) => stderr.flush(),
            LineWriter::Batched(_) => Ok(()),
        }
    }
}

/// Log lines dropped so far because the buffer was full (0 when lines are written directly).
pub fn dropped_lines() -> u64 {
    BATCHED.get().map_or(0, |shared| shared.dropped.load(Ordering::Relaxed))
}

/// What producers and the writer thread share.
#[derive(Debug)]
struct Shared {
    state: Mutex<Buffer>,
    /// Signalled when the buffer stops being empty, and when the guard closes it.
    filled: Condvar,
    capacity: usize,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct Buffer {
    bytes: Vec<u8>,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Buffer> {
        // A panic while holding the lock leaves whole lines behind: the buffer stays usable.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A bounded buffer of log lines emptied by a writer thread (see the module docs). Appending
/// never blocks on the sink.
#[derive(Debug)]
pub struct Batched {
    shared: Arc<Shared>,
}

impl Batched {
    /// Appends one line (tracing-subscriber writes each event whole), or drops and counts it.
    fn append(&self, line: &[u8]) {
        let mut buffer = self.shared.lock();
        if buffer.closed || buffer.bytes.len() + line.len() > self.shared.capacity {
            drop(buffer);
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let was_empty = buffer.bytes.is_empty();
        buffer.bytes.extend_from_slice(line);
        drop(buffer);
        if was_empty {
            self.shared.filled.notify_one();
        }
    }
}

/// Stops the writer thread when dropped, after it has written what is buffered.
#[derive(Debug)]
struct WriterGuard {
    shared: Arc<Shared>,
    finished: mpsc::Receiver<()>,
    wait: Duration,
}

impl Drop for WriterGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.filled.notify_one();
        let _ = self.finished.recv_timeout(self.wait);
    }
}

/// The buffered writer over `sink` and the guard of its writer thread.
fn batched<W: Write + Send + 'static>(sink: W, capacity: usize, gather: Duration) -> (Batched, WriterGuard) {
    let shared = Arc::new(Shared {
        state: Mutex::new(Buffer::default()),
        filled: Condvar::new(),
        capacity,
        dropped: AtomicU64::new(0),
    });
    let (done, finished) = mpsc::channel();
    let writer = shared.clone();
    let spawned = std::thread::Builder::new().name("allot-log-writer".into()).spawn(move || {
        write_batches(&writer, sink, gather);
        let _ = done.send(());
    });
    if let Err(e) = spawned {
        // No thread: every line is dropped and counted rather than blocking admission.
        eprintln!("allot: cannot start the log writer thread ({e}); log lines are dropped");
        shared.lock().closed = true;
    }
    (Batched { shared: shared.clone() }, WriterGuard { shared, finished, wait: FINAL_FLUSH })
}

/// The writer thread: waits for a first line, lets more gather, writes them all; until closed
/// and empty. Write errors are ignored (there is nowhere left to report them).
fn write_batches<W: Write>(shared: &Shared, mut sink: W, gather: Duration) {
    let mut spare = Vec::new();
    loop {
        let mut buffer = shared.lock();
        while buffer.bytes.is_empty() && !buffer.closed {
            buffer = shared.filled.wait(buffer).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        if buffer.bytes.is_empty() {
            return;
        }
        if !buffer.closed {
            drop(buffer);
            std::thread::sleep(gather);
            buffer = shared.lock();
        }
        let batch = std::mem::replace(&mut buffer.bytes, std::mem::take(&mut spare));
        drop(buffer);
        let _ = sink.write_all(&batch).and_then(|()| sink.flush());
        spare = batch;
        spare.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink that records what it is given, and can be made to block.
    #[derive(Clone, Default)]
    struct Sink {
        written: Arc<Mutex<Vec<u8>>>,
        writes: Arc<AtomicU64>,
        blocked: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Sink {
        fn block(&self, on: bool) {
            *self.blocked.0.lock().unwrap() = on;
            self.blocked.1.notify_all();
        }
        fn text(&self) -> String {
            String::from_utf8(self.written.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let (lock, unblocked) = &*self.blocked;
            let _unblocked = unblocked.wait_while(lock.lock().unwrap(), |blocked| *blocked).unwrap();
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.written.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("line {i}\n")).collect()
    }

    /// Lines come out whole and in order, gathered into a few writes, and the guard writes
    /// out what is left.
    #[test]
    fn lines_are_written_in_order_in_batches_and_flushed_by_the_guard() {
        let sink = Sink::default();
        let (writer, guard) = batched(sink.clone(), 1 << 20, Duration::from_millis(50));
        for line in lines(1_000) {
            LineWriter::Batched(&writer).write_all(line.as_bytes()).unwrap();
        }
        drop(guard);
        assert_eq!(sink.text(), lines(1_000).concat());
        let writes = sink.writes.load(Ordering::Relaxed);
        assert!((1..=3).contains(&writes), "1,000 lines written in {writes} writes");
        assert_eq!(writer.shared.dropped.load(Ordering::Relaxed), 0);
    }

    /// A sink that never returns: writing lines never blocks; past the buffer's capacity they
    /// are dropped and counted; the guard gives up waiting after its deadline.
    #[test]
    fn a_blocked_sink_never_blocks_a_writer_and_overflow_is_counted() {
        let sink = Sink::default();
        sink.block(true);
        let (writer, mut guard) = batched(sink.clone(), 100, Duration::ZERO);
        guard.wait = Duration::from_millis(100);
        // The first line may be taken by the writer thread before it blocks in the sink.
        let started = std::time::Instant::now();
        for _ in 0..1_000 {
            LineWriter::Batched(&writer).write_all(b"0123456789\n").unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(2), "writing lines waited on the sink");
        let dropped = writer.shared.dropped.load(Ordering::Relaxed);
        assert!((1_000 - 2 * 9..=1_000 - 9).contains(&dropped), "{dropped} of 1,000 lines dropped");
        let closing = std::time::Instant::now();
        drop(guard);
        assert!(closing.elapsed() < Duration::from_secs(1), "the guard waits at most its deadline");
        sink.block(false);
    }

    /// Once the sink drains again, lines flow again.
    #[test]
    fn lines_flow_again_when_the_sink_drains() {
        let sink = Sink::default();
        sink.block(true);
        let (writer, guard) = batched(sink.clone(), 64, Duration::ZERO);
        for _ in 0..100 {
            LineWriter::Batched(&writer).write_all(b"blocked\n").unwrap();
        }
        sink.block(false);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !writer.shared.lock().bytes.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        LineWriter::Batched(&writer).write_all(b"after\n").unwrap();
        drop(guard);
        assert!(sink.text().ends_with("after\n"), "{}", sink.text());
    }
}
