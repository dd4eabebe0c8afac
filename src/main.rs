//! The `allot` binary: process set-up, then one command (the command line is [`allot::cli`]).

use std::process::ExitCode;

use allot::cli::{Cli, LogFormat};

/// mimalloc instead of glibc malloc: under load glibc's allocator took ~30 % of the server's
/// CPU (allocations made on one thread and freed on another), see benches/README.md. The
/// `system-allocator` feature leaves it out, for heap profilers that hook malloc (heaptrack).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: `kubectl logs` and log shippers get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() -> ExitCode {
    allot::install_crypto_provider();
    // Also the kubectl plugin: run through a link named `kubectl-allot`.
    let cli = Cli::parse_args();
    init_logging(cli.log_format);
    // After logging: a panic is then one log line, not a message and backtrace on stderr.
    allot::expression::install_panic_hook();
    match allot::cli::run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("allot: {e:#}");
            ExitCode::from(2)
        }
    }
}
