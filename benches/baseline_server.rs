//! The least a webhook can do, on the same stack as `allot serve`, for load comparisons
//! (`scripts/load.sh`): axum on axum-server, rustls with the ring provider and ALPN
//! `h2, http/1.1` (`allot::server::tls::server_config`), TCP_NODELAY on accepted connections, a
//! multi-threaded tokio runtime.
//! `POST /mutate` (and `/validate`) parse the body only to read `request.uid` and allow
//! everything. What `allot serve` costs beyond this is the engine, metrics, logging and the
//! timeout layer.
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
}

#[derive(Deserialize)]
struct Review {
    request: ReviewRequest,
}

#[derive(Deserialize)]
struct ReviewRequest {
    uid: String,
}

async fn allow(body: Bytes) -> Response {
    match serde_json::from_slice::<Review>(&body) {
        Ok(review) => {
            let answer = serde_json::json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": review.request.uid, "allowed": true},
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
    let app =
        Router::new().route("/mutate", post(allow)).route("/validate", post(allow)).route("/healthz", get(healthz));
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
