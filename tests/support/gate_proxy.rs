//! A forwarding proxy in front of the API server, for what Allot does while its caches fill. It
//! serves plain HTTP on loopback (an `allot serve` kubeconfig may name `http://`), forwards every
//! request with the admin client's own credentials ([`kube::Client::send`]: TLS and the token to
//! the API server; responses, watches included, streamed back as they come), and reads the
//! cluster-wide Pod reads a cache fill makes:
//! - the streaming list (`GET /api/v1/pods?watch=true&…&sendInitialEvents=true`), which it can
//!   hold until the test releases it, or refuse with the 422 an API server with its WatchList
//!   feature off answers;
//! - a LIST (`GET /api/v1/pods?limit=…`, the paged fallback), which it can hold;
//! - a plain watch (`watch=true`, no initial events: what follows a LIST), always forwarded.
//!
//! Every such read is recorded in arrival order with how it was answered.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderName, Request, Response, StatusCode, header};
use http_body_util::BodyExt;

/// What the proxy does with the Pod reads of a cache fill; everything else is forwarded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gates {
    /// Streaming lists wait until this is false.
    pub hold_streaming: bool,
    /// LISTs of Pods wait until this is false.
    pub hold_list: bool,
    /// Streaming lists are answered 422 (WatchList off) instead of forwarded.
    pub refuse_streaming: bool,
}

/// Which kind of cluster-wide Pod read a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodRead {
    /// `watch=true&sendInitialEvents=true`: the streaming list.
    Streaming,
    /// No `watch`: a LIST (a page of one).
    List,
    /// `watch=true` without initial events.
    Watch,
}

/// One Pod read as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub read: PodRead,
    /// The query string, as sent.
    pub query: String,
    pub arrived: Instant,
    /// It waited on a gate.
    pub held: bool,
    /// When the gate let it through (or it was refused); `None` while it waits.
    pub passed: Option<Instant>,
    /// The status it was answered with; `None` until then.
    pub status: Option<u16>,
}

struct Shared {
    upstream: kube::Client,
    gates: tokio::sync::watch::Sender<Gates>,
    seen: Mutex<Vec<Seen>>,
}

/// The running proxy; stops serving when dropped.
pub struct GateProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for GateProxy {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl GateProxy {
    /// Serves on a free loopback port, forwarding through `upstream` (a client of the API
    /// server), with `gates` in force from the first request.
    pub async fn start(upstream: kube::Client, gates: Gates) -> GateProxy {
        let shared =
            Arc::new(Shared { upstream, gates: tokio::sync::watch::Sender::new(gates), seen: Mutex::new(Vec::new()) });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the gate proxy");
        let addr = listener.local_addr().expect("the gate proxy's address");
        let state = shared.clone();
        let app = axum::Router::new().fallback(move |req: Request<Body>| {
            let state = state.clone();
            async move { handle(&state, req).await }
        });
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("the gate proxy serves");
        });
        GateProxy { addr, shared, server }
    }

    /// A kubeconfig (YAML) whose only cluster is this proxy; no credentials (the proxy adds its
    /// own).
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: gate-proxy\n  cluster:\n    server: http://{}\nusers:\n- name: \
             anonymous\n  user: {{}}\ncontexts:\n- name: gate-proxy\n  context: {{cluster: gate-proxy, user: \
             anonymous}}\ncurrent-context: gate-proxy\n",
            self.addr
        )
    }

    /// Changes the gates: a held read whose gate opens goes on to the API server at once.
    pub fn set(&self, change: impl FnOnce(&mut Gates)) {
        self.shared.gates.send_modify(change);
    }

    /// The Pod reads so far, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().expect("the proxy's record").clone()
    }

    /// The reads of `read`'s kind waiting on their gate now.
    pub fn waiting(&self, read: PodRead) -> usize {
        self.seen().iter().filter(|s| s.read == read && s.held && s.passed.is_none()).count()
    }
}

/// Classifies a cluster-wide Pod read; `None` for every other request.
fn pod_read(req: &Request<Body>) -> Option<PodRead> {
    if req.method() != axum::http::Method::GET || req.uri().path() != "/api/v1/pods" {
        return None;
    }
    let query = req.uri().query().unwrap_or_default();
    let has = |pair: &str| query.split('&').any(|kv| kv == pair);
    Some(match (has("watch=true") || has("watch=1"), has("sendInitialEvents=true")) {
        (true, true) => PodRead::Streaming,
        (true, false) => PodRead::Watch,
        (false, _) => PodRead::List,
    })
}

async fn handle(shared: &Shared, req: Request<Body>) -> Response<Body> {
    let Some(read) = pod_read(&req) else { return forward(shared, req).await };
    let index = {
        let mut seen = shared.seen.lock().expect("the proxy's record");
        seen.push(Seen {
            read,
            query: req.uri().query().unwrap_or_default().to_string(),
            arrived: Instant::now(),
            held: false,
            passed: None,
            status: None,
        });
        seen.len() - 1
    };
    let update = |f: &dyn Fn(&mut Seen)| f(&mut shared.seen.lock().expect("the proxy's record")[index]);
    let gates = *shared.gates.borrow();
    if read == PodRead::Streaming && gates.refuse_streaming {
        update(&|s| {
            s.passed = Some(Instant::now());
            s.status = Some(422);
        });
        return watch_list_off();
    }
    let holds = |g: &Gates| match read {
        PodRead::Streaming => g.hold_streaming,
        PodRead::List => g.hold_list,
        PodRead::Watch => false,
    };
    if holds(&gates) {
        update(&|s| s.held = true);
        let mut gates = shared.gates.subscribe();
        // The sender lives as long as `shared`; an error means the proxy is going away.
        let _ = gates.wait_for(|g| !holds(g)).await;
    }
    update(&|s| s.passed = Some(Instant::now()));
    let response = forward(shared, req).await;
    let status = response.status().as_u16();
    update(&|s| s.status = Some(status));
    response
}

/// What an API server whose WatchList feature is off answers a watch with `sendInitialEvents`
/// (apimachinery's ListOptions validation).
fn watch_list_off() -> Response<Body> {
    let message = "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: {message}"),
        "reason": "Invalid",
        "details": {"group": "meta.k8s.io", "kind": "ListOptions",
                    "causes": [{"reason": "FieldValueForbidden", "message": format!("Forbidden: {message}"), "field": "sendInitialEvents"}]},
        "code": 422
    });
    Response::builder()
        .status(StatusCode::UNPROCESSABLE_ENTITY)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(status.to_string()))
        .expect("a 422 response")
}

/// Not hop-by-hop, and not what the upstream client sets itself (host, credentials).
fn forwarded(name: &HeaderName) -> bool {
    ![
        header::HOST,
        header::AUTHORIZATION,
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::CONTENT_LENGTH,
        header::UPGRADE,
    ]
    .contains(name)
}

/// Sends `req` on to the API server and streams its answer back (502 if it cannot be sent).
async fn forward(shared: &Shared, req: Request<Body>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return bad_gateway("could not read the request body".into());
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut upstream = Request::builder().method(parts.method.clone()).uri(path);
    for (name, value) in parts.headers.iter().filter(|(n, _)| forwarded(n)) {
        upstream = upstream.header(name, value);
    }
    let Ok(upstream) = upstream.body(kube::client::Body::from(body)) else {
        return bad_gateway(format!("could not build the request for {path}"));
    };
    match shared.upstream.send(upstream).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            for name in [header::CONNECTION, header::TRANSFER_ENCODING] {
                parts.headers.remove(name);
            }
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => bad_gateway(format!("{path}: {e}")),
    }
}

fn bad_gateway(message: String) -> Response<Body> {
    Response::builder()
        .status(StatusCode::BAD_GATEWAY)
        .body(Body::from(format!("gate proxy: {message}")))
        .expect("a 502 response")
}
