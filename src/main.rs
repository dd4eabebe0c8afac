//! The `allot` binary: process set-up, then one command (the command line is [`allot::cli`]).

use std::process::ExitCode;

use allot::cli::{Cli, Command};
use allot::server::logging::{self, Destination};

/// mimalloc instead of glibc malloc: under load glibc's allocator took ~30 % of the server's
/// CPU (allocations made on one thread and freed on another), see benches/README.md. The
/// `system-allocator` feature leaves it out, for heap profilers that hook malloc (heaptrack).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    allot::install_crypto_provider();
    // Also the kubectl plugin: run through a link named `kubectl-allot`.
    let cli = Cli::parse_args();
    // The server's log lines are buffered for a writer thread: a blocked stderr must not block
    // admission (see `allot::server::logging`). The guard writes out what is still buffered.
    let destination = if matches!(cli.command, Command::Serve(_)) { Destination::Batched } else { Destination::Direct };
    let log_writer = logging::init(cli.log_format, destination);
    // After logging: a panic is then one log line, not a message and backtrace on stderr.
    allot::model::expression::install_panic_hook();
    let result = allot::cli::run(cli.command);
    // What was logged comes before the last word.
    drop(log_writer);
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("allot: {e:#}");
            ExitCode::from(2)
        }
    }
}
