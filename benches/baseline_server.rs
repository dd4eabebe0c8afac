//! The least a webhook can do, on the same stack as `allot serve`, for load comparisons
//! (`scripts/load.sh`): axum on axum-server, rustls with the ring provider and ALPN
//! `h2, http/1.1` (`allot::server::tls::server_config`), TCP_NODELAY on accepted connections, a
//! multi-threaded tokio runtime.
//! `POST /mutate` (and `/validate`) parse the body only to read `request.uid` and allow
//! everything. What `allot serve` costs beyond this is the engine, metrics, logging and the
//! timeout layer. With `--mutate-patch`, `/mutate` answers every review with that JSON Patch,
//! so a comparison on a real API server can tell what a webhook's own cost is from what the
//! API server spends applying any mutation.
//!
//! `cargo run --release --example baseline-server -- --tls-cert CERT --tls-key KEY --addr 127.0.0.1:0`

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum_server::accept::NoDelayAcceptor;
use axum_server::tls_rustls::RustlsAcceptor;
use clap::Parser;
use serde::Deserialize;

/// Allow-everything AdmissionReview server: the baseline for `scripts/load.sh`.
#[derive(Parser)]
#[command(name = "baseline-server")]
struct Args {
    /// Serving certificate chain (PEM).
    #[arg(long)]
    tls_cert: PathBuf,
    /// Serving private key (PEM).
    #[arg(long)]
    tls_key: PathBuf,
    #[arg(long, default_value = "127.0.0.1:8444")]
    addr: SocketAddr,
    /// Leave Nagle's algorithm on (axum-server's default acceptor) instead of setting
    /// TCP_NODELAY on accepted connections as `allot serve` does; Nagle meeting delayed ACKs
    /// shows up as a ~40 ms HTTP/2 tail (`scripts/load.sh` with `BASELINE_NAGLE=1`).
    #[arg(long)]
    no_tcp_nodelay: bool,
    /// A JSON Patch (JSON text) that `/mutate` returns with every answer, as a mutating webhook
    /// that changes each object does.
    #[arg(long, value_parser = parse_patch)]
    mutate_patch: Option<String>,
    /// Busy-waits this many microseconds in every review, as a webhook whose evaluation costs
    /// that much CPU: what a slower webhook costs the API server besides its own CPU.
    #[arg(long, default_value_t = 0)]
    spin_us: u64,
}

/// Spins for `micros` (no sleep: tokio's timer would round it up to a millisecond).
fn spin(micros: u64) {
    let until = std::time::Instant::now() + std::time::Duration::from_micros(micros);
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Checks the patch is a JSON array and returns it base64-encoded, as the answer carries it.
fn parse_patch(text: &str) -> Result<String, String> {
    use base64::Engine as _;
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(_)) => Ok(base64::engine::general_purpose::STANDARD.encode(text)),
        Ok(_) => Err("a JSON Patch is a JSON array of operations".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

#[derive(Deserialize)]
struct Review {
    request: ReviewRequest,
}

#[derive(Deserialize)]
struct ReviewRequest {
    uid: String,
}

/// Allows the review; with `patch` (base64), also mutates it.
fn answer(body: &[u8], patch: Option<&str>) -> Response {
    match serde_json::from_slice::<Review>(body) {
        Ok(review) => {
            let mut response = serde_json::json!({"uid": review.request.uid, "allowed": true});
            if let Some(patch) = patch {
                response["patchType"] = "JSONPatch".into();
                response["patch"] = patch.into();
            }
            let answer = serde_json::json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": response,
            });
            ([(header::CONTENT_TYPE, "application/json")], answer.to_string()).into_response()
        }
        Err(e) => (StatusCode::BAD_REQUEST, format!("invalid AdmissionReview: {e}\n")).into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    allot::install_crypto_provider();
    let args = Args::parse();
    let tls = allot::server::tls::server_config(&args.tls_cert, &args.tls_key)?;
    let rustls = axum_server::tls_rustls::RustlsConfig::from_config(tls);
    let patch: Option<std::sync::Arc<str>> = args.mutate_patch.map(Into::into);
    let spin_us = args.spin_us;
    let mutate = move |body: Bytes| {
        let patch = patch.clone();
        async move {
            spin(spin_us);
            answer(&body, patch.as_deref())
        }
    };
    let allow = move |body: Bytes| async move {
        spin(spin_us);
        answer(&body, None)
    };
    let app =
        Router::new().route("/mutate", post(mutate)).route("/validate", post(allow)).route("/healthz", get(healthz));
    let handle = axum_server::Handle::new();
    let server = if !args.no_tcp_nodelay {
        let acceptor = RustlsAcceptor::new(rustls).acceptor(NoDelayAcceptor::new());
        tokio::spawn(
            axum_server::bind(args.addr).acceptor(acceptor).handle(handle.clone()).serve(app.into_make_service()),
        )
    } else {
        tokio::spawn(axum_server::bind_rustls(args.addr, rustls).handle(handle.clone()).serve(app.into_make_service()))
    };
    let Some(addr) = handle.listening().await else {
        server.await??;
        anyhow::bail!("could not listen on {}", args.addr);
    };
    // The same shape of line as `allot serve` prints, for scripts.
    println!("baseline-server serving webhooks on https://{addr}");
    server.await??;
    Ok(())
}
