//! The `allot serve` process: start-up in order (policies, TLS, identity, watches, the gang
//! controller and the ledger's reconciler), serving webhooks and metrics, and shutdown within the
//! grace period. Wiring only: what each part does is in its own module.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::startup::Caches;
use super::{
    AppState, ServeConfig, connections, device_classes, identity, metrics_router, reload, router_with_inline_limit, tls,
};
use crate::control::cluster::ClusterState;
use crate::control::gang::controller::{Clients, ControllerHandle};
use crate::control::quota::SharedLedger;
use crate::control::quota::shared::{ReconcilerHooks, spawn_reconciler};
use crate::model::error::Error;
use crate::model::namespaces::{NamespaceLabels, NoNamespaces};
use crate::model::policy::{self, PolicySet};

/// Runs the server until SIGTERM or SIGINT.
pub async fn run(config: ServeConfig) -> Result<(), Error> {
    let shutdown = ShutdownSignal::install();
    let (sources, policies) = load_policies(&config)?;
    // Hashed before loading: a rotation that lands in between is then seen as a change and
    // loaded again, never mistaken for the pair already in force.
    let cert_baseline = reload::cert_hash(&config.tls_cert, &config.tls_key, config.client_ca.as_deref());
    let tls = tls::server_config_with_client_ca(&config.tls_cert, &config.tls_key, config.client_ca.as_deref())?;
    let rustls = axum_server::tls_rustls::RustlsConfig::from_config(tls);

    let client = if config.use_kube { reload::kube_client().await } else { None };
    // Before anything is served: the name Allot's own gate lifts carry decides what the
    // validating webhook lets through.
    let identity = identity::resolve(client.as_ref(), config.allot_username.as_deref())
        .await
        .map_err(|e| Error::Identity(e.to_string()))?;
    let caches = Arc::new(Caches::default());
    let namespaces: Arc<dyn NamespaceLabels> = match &client {
        Some(c) => {
            caches.namespaces.expect();
            reload::watch_namespaces(c.clone(), caches.clone())
        }
        None => Arc::new(NoNamespaces),
    };
    let cluster = Arc::new(ClusterState::default());
    let ledger = shared_ledger(client.as_ref(), &config);
    let state = AppState::with_ledger(
        policies,
        namespaces,
        cluster.clone(),
        caches.clone(),
        identity.username.clone(),
        ledger.clone(),
    );
    state.metrics.set_identity(&identity.username, identity.source.as_str());
    state.set_native_split(&sources);
    let background = start_background(client.as_ref(), &config, &state, &caches, ledger).await;

    if let Some(expiry) = tls::not_after(&config.tls_cert) {
        state.metrics.certificate_expiry.set(expiry);
    }
    let (server, handle) = serve_webhooks(&config, &state, rustls.clone());
    let anchor = spawn_timer_anchor(anchor_period(config.request_timeout.min(config.header_read_timeout)));
    let metrics = serve_metrics(&config, &state).await?;

    let Some(addr) = handle.listening().await else {
        return match server.await {
            Ok(Err(e)) => Err(Error::Io { path: PathBuf::from(config.addr.to_string()), source: e }),
            _ => Err(Error::Certificates(format!("could not listen on {}", config.addr))),
        };
    };
    // One line on stdout that tools (and the integration tests) can read.
    println!("allot serving webhooks on https://{addr} and metrics on http://{}", metrics.addr);
    tracing::info!(%addr, metrics_addr = %metrics.addr, "serving");

    let reloader = reload::spawn(state.clone(), rustls, config.clone(), cert_baseline);
    shutdown.wait().await;
    tracing::info!("shutting down: refusing new connections, closing idle ones");
    state.shutting_down.store(true, Ordering::Relaxed);
    let deadline = tokio::time::Instant::now() + config.shutdown_grace;
    // Graceful shutdown closes idle keep-alive connections at once (kubernetes#127335) and
    // lets in-flight requests finish within the grace period.
    handle.graceful_shutdown(Some(config.shutdown_grace));
    let background = background.hand_over_lease(config.shutdown_grace).await;
    let metrics_stopped = metrics.stop(deadline);
    reloader.abort();
    anchor.abort();
    background.finish(server, deadline).await;
    metrics_stopped.await;
    tracing::info!("stopped");
    Ok(())
}

/// The policy files read and compiled (the sources are kept for `--native-covers`).
fn load_policies(config: &ServeConfig) -> Result<(Vec<policy::Source>, PolicySet), Error> {
    let load_error = |e: policy::LoadErrors| Error::Policy {
        location: config.policies.display().to_string(),
        message: e.to_string(),
    };
    let sources = policy::read_sources(&config.policies).map_err(load_error)?;
    let policies = policy::compile(&sources).map_err(load_error)?;
    tracing::info!(version = %policies.version, summary = ?policies.summary(), "policies loaded");
    Ok((sources, policies))
}

/// Deny-mode quota on the API server's shared ledger wherever a leader (the gang controller's
/// Lease holder) reconciles it; each admission may spend 70% of the request deadline on it
/// (quota is decided last; evaluation as a whole gets 90%).
fn shared_ledger(client: Option<&kube::Client>, config: &ServeConfig) -> Option<Arc<SharedLedger>> {
    let (client, controller) = (client?, config.gang_controller.as_ref()?);
    let ledger =
        Arc::new(SharedLedger::new(client.clone(), &controller.lease_namespace, config.request_timeout * 7 / 10));
    ledger.watch();
    ledger.spawn_flusher();
    Some(ledger)
}

/// What runs beside the webhooks, stopped in order at shutdown.
struct Background {
    controller: Option<ControllerHandle>,
    reconciler: Option<tokio::task::JoinHandle<()>>,
    ledger: Option<Arc<SharedLedger>>,
}

/// The watches the webhooks read (ResourceClaims, DeviceClasses), the gang controller and the
/// ledger's reconciler, where there is an API server to talk to.
async fn start_background(
    client: Option<&kube::Client>,
    config: &ServeConfig,
    state: &Arc<AppState>,
    caches: &Arc<Caches>,
    ledger: Option<Arc<SharedLedger>>,
) -> Background {
    let cluster = state.cluster.clone();
    if let Some(c) = client {
        // (Set once, here, before the server accepts a request.)
        let claims = reload::watch_claims(c.clone(), cluster.clone());
        cluster.set_claims(claims.clone());
        let _ = state.claims.set(claims);
        device_classes::watch(c.clone(), state.clone());
    }
    let controller = match (client, &config.gang_controller) {
        (Some(c), Some(controller)) => {
            tracing::info!(lease = %controller.lease_name, namespace = %controller.lease_namespace, identity = %controller.identity, "starting the gang controller");
            caches.pods.expect();
            let synced = caches.clone();
            let evictions = reload::kube_client_without_retries().await.unwrap_or_else(|| c.clone());
            Some(crate::control::gang::controller::spawn(
                Clients { api: c.clone(), evictions },
                cluster.clone(),
                state.policies.clone(),
                state.namespaces.clone(),
                controller.clone(),
                state.metrics.controller.clone(),
                Box::new(move || synced.pods.mark_synced()),
            ))
        }
        (None, Some(_)) => {
            tracing::warn!("no Kubernetes API: the gang controller is not running; gated pods stay gated");
            None
        }
        _ => None,
    };
    let reconciler = ledger.clone().map(|ledger| {
        let leader = state.metrics.controller.leader.clone();
        caches.ledgers.expect();
        let (synced, bootstrapped) = (caches.clone(), caches.clone());
        spawn_reconciler(
            ledger,
            cluster,
            state.policies.clone(),
            state.namespaces.clone(),
            ReconcilerHooks {
                leading: Box::new(move || leader.get() == 1),
                ready: Box::new(move || synced.watches_synced()),
                ledgers_exist: Box::new(move || bootstrapped.ledgers.mark_synced()),
            },
        )
    });
    Background { controller, reconciler, ledger }
}

impl Background {
    /// Hands the Lease over now, while requests drain: the next leader starts at once.
    async fn hand_over_lease(mut self, grace: Duration) -> Background {
        if let Some(controller) = self.controller.take() {
            controller.shutdown(grace.min(Duration::from_secs(5))).await;
        }
        self
    }

    /// Stops the reconciler, waits for the webhook server to finish its requests, then gives
    /// this replica's quota allowances back: no request is in flight any more.
    async fn finish<T>(self, server: tokio::task::JoinHandle<T>, deadline: tokio::time::Instant) {
        if let Some(reconciler) = self.reconciler {
            reconciler.abort();
        }
        let _ = server.await;
        if let Some(ledger) = &self.ledger {
            let _ = tokio::time::timeout_at(deadline, ledger.give_back()).await;
        }
    }
}

type WebhookServer = tokio::task::JoinHandle<std::io::Result<()>>;

/// The HTTPS webhook server, started: its task and the handle that stops it.
fn serve_webhooks(
    config: &ServeConfig,
    state: &Arc<AppState>,
    rustls: axum_server::tls_rustls::RustlsConfig,
) -> (WebhookServer, axum_server::Handle<std::net::SocketAddr>) {
    let app = router_with_inline_limit(
        state.clone(),
        config.max_body_bytes,
        config.request_timeout,
        config.inline_body_bytes,
    );
    let handle = axum_server::Handle::new();
    // TCP_NODELAY on every accepted connection: axum-server's default acceptor leaves Nagle on,
    // and Nagle + delayed ACK adds ~40 ms to responses that leave in two segments.
    let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(rustls)
        .handshake_timeout(config.header_read_timeout)
        .acceptor(axum_server::accept::NoDelayAcceptor::new());
    let acceptor =
        connections::CappedAcceptor::new(acceptor, config.max_connections, state.metrics.connections.clone());
    let mut server = axum_server::bind(config.addr).acceptor(acceptor).handle(handle.clone());
    // A slow client (slowloris) cannot hold a connection open by sending its head a byte at a
    // time; hyper needs a timer for that.
    server
        .http_builder()
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);
    (tokio::spawn(server.serve(app.into_make_service())), handle)
}

/// The plain-HTTP metrics server, started.
struct MetricsServer {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn serve_metrics(config: &ServeConfig, state: &Arc<AppState>) -> Result<MetricsServer, Error> {
    let listener = tokio::net::TcpListener::bind(config.metrics_addr)
        .await
        .map_err(|e| Error::Io { path: PathBuf::from(config.metrics_addr.to_string()), source: e })?;
    let addr = listener.local_addr().map_err(|e| Error::Io { path: PathBuf::from("metrics"), source: e })?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(
        axum::serve(listener, metrics_router(state.clone()))
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .into_future(),
    );
    Ok(MetricsServer { addr, stop, task })
}

impl MetricsServer {
    /// Asks the server to stop now; the future waits for it. axum's graceful shutdown has no
    /// deadline of its own: a metrics client stuck mid-request would keep the process alive
    /// until SIGKILL. It gets the same grace period.
    fn stop(self, deadline: tokio::time::Instant) -> impl Future<Output = ()> {
        let _ = self.stop.send(());
        async move {
            let _ = tokio::time::timeout_at(deadline, self.task).await;
        }
    }
}

/// Keeps one timer pending at most `period` ahead, for the per-request deadlines' sake.
///
/// Every review arms timers (the request deadline, hyper's header-read timeout) that it
/// cancels when answered. Tokio wakes its parked I/O driver whenever a timer is armed earlier
/// than the driver's next wake-up, which, when no other timer is pending, is every time: an
/// eventfd write, a futex wake and an epoll round per review (98 % of the server's `write`
/// calls at 50 req/s, ~1 per review at 2,000 req/s; the uid-echo baseline, without timers,
/// makes 0.15). With this timer always pending and nearer than any deadline, arming a deadline
/// wakes nobody; the cost is one wake-up per `period`. Performance only: every deadline fires
/// as before whether or not this runs.
fn spawn_timer_anchor(period: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
        }
    })
}

/// Half the shortest per-request deadline (so the anchor is always nearer than a deadline
/// armed after it), between 10 ms and 1 s.
fn anchor_period(shortest_deadline: Duration) -> Duration {
    (shortest_deadline / 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Listens for SIGTERM and SIGINT from the moment it is created (before the serving line is
/// printed, so a supervisor that signals right after start-up is never met by the default
/// action); `.wait()` returns on the first.
struct ShutdownSignal {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
async fn recv(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

impl ShutdownSignal {
    fn install() -> ShutdownSignal {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            ShutdownSignal {
                terminate: signal(SignalKind::terminate()).ok(),
                interrupt: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        ShutdownSignal {}
    }

    async fn wait(mut self) {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = recv(self.terminate.as_mut()) => {},
                _ = recv(self.interrupt.as_mut()) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
