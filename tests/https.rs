//! End-to-end tests of `allot serve`: the real binary, real certificates from `allot certs`, and
//! real HTTPS on loopback (HTTP/1.1 keep-alive, which is what the API server uses in-cluster, and
//! HTTP/2 by ALPN), fed with AdmissionReviews captured from a kube-apiserver.
//!
//! Every test starts its own server on ephemeral ports, with its own copy of `policies/` and its
//! own certificates in a temporary directory, so tests are independent and may edit their files.
//! The server is killed when its guard drops, also when a test fails; its stderr is printed then.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::{http1, http2};
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Method, Request, StatusCode, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

const BIN: &str = env!("CARGO_BIN_EXE_allot");
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a reload (policies or certificate) may take to show; the poll interval is 1 s.
const RELOAD_DEADLINE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// The server under test

/// A running `allot serve`, killed on drop.
struct Server {
    child: Child,
    dir: TempDir,
    https: SocketAddr,
    metrics: SocketAddr,
    /// Lines the server printed on stdout after the first one.
    stdout: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    /// The stderr pipe held open and never read, for [`Server::start_with_stderr_unread`].
    _unread_stderr: Option<std::process::ChildStderr>,
}

impl Server {
    /// Certificates and a copy of the shipped policies in a fresh directory, then `allot serve`.
    fn start(extra_args: &[&str]) -> Server {
        Server::start_in(shipped_dir(), extra_args)
    }

    fn start_in(dir: TempDir, extra_args: &[&str]) -> Server {
        Server::spawn(dir, extra_args, true, "info")
    }

    /// Like [`Server::start`], with `RUST_LOG` set to `log_filter`.
    fn start_logging(log_filter: &str) -> Server {
        Server::spawn(shipped_dir(), &[], true, log_filter)
    }

    /// Like [`Server::start_in`], but nobody reads the server's stderr: once the pipe's buffer
    /// is full, every write to it blocks (a stalled log collector).
    fn start_with_stderr_unread(dir: TempDir, extra_args: &[&str]) -> Server {
        Server::spawn(dir, extra_args, false, "info")
    }

    fn spawn(dir: TempDir, extra_args: &[&str], read_stderr: bool, log_filter: &str) -> Server {
        let mut child =
            serve_command(dir.path(), extra_args).env("RUST_LOG", log_filter).spawn().expect("spawn allot serve");
        let (stderr, unread_stderr) =
            if read_stderr { (collect_stderr(&mut child).0, None) } else { (Arc::default(), child.stderr.take()) };
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Build the guard before waiting, so the child is killed if the line never comes.
        let mut server = Server {
            child,
            dir,
            https: "0.0.0.0:0".parse().unwrap(),
            metrics: "0.0.0.0:0".parse().unwrap(),
            stdout: rx,
            stderr,
            _unread_stderr: unread_stderr,
        };
        let line = match server.stdout.recv_timeout(STARTUP_TIMEOUT) {
            Ok(line) => line,
            Err(e) => panic!(
                "allot serve printed no address line within {STARTUP_TIMEOUT:?} ({e}); exit status {:?}; stderr:\n{}",
                server.child.try_wait(),
                server.stderr()
            ),
        };
        let (https, metrics) = parse_serving_line(&line);
        server.https = https;
        server.metrics = metrics;
        server
    }

    fn policies(&self) -> PathBuf {
        self.dir.path().join("policies")
    }

    fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn connect(&self, alpn: Alpn) -> Client {
        Client::connect(self.https, &self.certs().join("ca.crt"), "localhost", alpn).await
    }

    /// GET on the plain-HTTP metrics address.
    async fn metrics_get(&self, path: &str) -> Resp {
        plain_get(self.metrics, path).await
    }

    async fn metrics_text(&self) -> String {
        let resp = self.metrics_get("/metrics").await;
        assert_eq!(resp.status, StatusCode::OK, "/metrics: {}", resp.text());
        resp.text()
    }

    /// Waits (without blocking the runtime) for the process to exit.
    async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- allot serve stderr ----\n{}----", self.stderr());
        }
    }
}

/// A fresh directory with certificates and a copy of the shipped policies.
fn shipped_dir() -> TempDir {
    let dir = tempfile::tempdir().expect("temporary directory");
    copy_dir(&repo_path("policies"), &dir.path().join("policies"));
    make_certs(&dir.path().join("certs"));
    dir
}

fn serve_command(dir: &Path, extra_args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve")
        .arg("--policies")
        .arg(dir.join("policies"))
        .arg("--tls-cert")
        .arg(dir.join("certs/tls.crt"))
        .arg("--tls-key")
        .arg(dir.join("certs/tls.key"))
        .args(["--addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--no-namespace-watch"])
        .args(["--reload-interval-secs", "1"])
        .args(extra_args)
        .env_remove("ALLOT_LOG_FORMAT")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Reads the child's stderr into a buffer (a full pipe would block the server).
fn collect_stderr(child: &mut Child) -> (Arc<Mutex<String>>, std::thread::JoinHandle<()>) {
    let buffer = Arc::new(Mutex::new(String::new()));
    let mut stderr = child.stderr.take().expect("piped stderr");
    let sink = buffer.clone();
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut chunk) {
            if n == 0 {
                break;
            }
            if let Ok(mut s) = sink.lock() {
                s.push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        }
    });
    (buffer, reader)
}

/// `allot serving webhooks on https://ADDR and metrics on http://ADDR2`
fn parse_serving_line(line: &str) -> (SocketAddr, SocketAddr) {
    let rest = line
        .strip_prefix("allot serving webhooks on https://")
        .unwrap_or_else(|| panic!("unexpected first stdout line: {line:?}"));
    let (https, metrics) =
        rest.split_once(" and metrics on http://").unwrap_or_else(|| panic!("unexpected first stdout line: {line:?}"));
    let https: SocketAddr = https.parse().unwrap_or_else(|e| panic!("webhook address in {line:?}: {e}"));
    let metrics: SocketAddr = metrics.parse().unwrap_or_else(|e| panic!("metrics address in {line:?}: {e}"));
    assert!(https.ip().is_loopback() && https.port() != 0, "webhook address {https}");
    assert!(metrics.ip().is_loopback() && metrics.port() != 0, "metrics address {metrics}");
    assert_ne!(https.port(), metrics.port());
    (https, metrics)
}

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create policy directory");
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())) {
        let entry = entry.expect("directory entry");
        if entry.file_type().expect("file type").is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy policy file");
        }
    }
}

/// Replaces a file the way an editor or a ConfigMap update does: a new file renamed over the old
/// one, so the server never reads half a write.
fn replace_file(path: &Path, contents: &str) {
    let staging = path.parent().and_then(Path::parent).expect("a parent directory").join(".staging");
    std::fs::write(&staging, contents).unwrap_or_else(|e| panic!("{}: {e}", staging.display()));
    std::fs::rename(&staging, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Runs `allot certs` into `out` (a CA, reused when present, and a serving certificate).
fn make_certs(out: &Path) {
    let output = Command::new(BIN)
        .arg("certs")
        .arg("--out")
        .arg(out)
        .args(["--dns-name", "localhost", "--dns-name", "127.0.0.1"])
        .output()
        .expect("run allot certs");
    assert!(
        output.status.success(),
        "allot certs failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    for file in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(out.join(file).is_file(), "allot certs did not write {file}");
    }
}

/// Polls `check` until it returns `Some`, or panics with `what` after `deadline`.
async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let until = Instant::now() + deadline;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if Instant::now() >= until => {
                panic!("{what}: not within {deadline:?}; last: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The HTTPS client

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alpn {
    H1,
    H2,
}

impl Alpn {
    fn protocol(self) -> &'static [u8] {
        match self {
            Alpn::H1 => b"http/1.1",
            Alpn::H2 => b"h2",
        }
    }

    fn version(self) -> Version {
        match self {
            Alpn::H1 => Version::HTTP_11,
            Alpn::H2 => Version::HTTP_2,
        }
    }
}

fn client_config(ca: &Path, alpn: Alpn) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap_or_else(|e| panic!("{}: {e}", ca.display())) {
        roots.add(cert.expect("CA certificate")).expect("add CA to the root store");
    }
    assert_eq!(roots.len(), 1, "ca.crt should hold exactly the CA");
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.protocol().to_vec()];
    // Every connection does a full handshake, so it shows the certificate served right now.
    config.resumption = tokio_rustls::rustls::client::Resumption::disabled();
    Arc::new(config)
}

enum Sender {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

/// One TLS connection to the webhook port, HTTP/1.1 or HTTP/2 as ALPN negotiated.
struct Client {
    sender: Sender,
    authority: String,
    /// What ALPN negotiated.
    alpn: Option<Vec<u8>>,
    /// The server's leaf certificate (DER).
    leaf: Vec<u8>,
    /// Ends when the connection closes.
    connection: tokio::task::JoinHandle<()>,
    requests: usize,
}

struct Resp {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    body: Bytes,
}

impl Resp {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("response is not JSON ({e}): {}", self.text()))
    }
}

impl Client {
    async fn connect(addr: SocketAddr, ca: &Path, server_name: &str, alpn: Alpn) -> Client {
        let tls = tls_connect(addr, ca, server_name, alpn).await;
        let session = tls.get_ref().1;
        let negotiated = session.alpn_protocol().map(<[u8]>::to_vec);
        let leaf = session
            .peer_certificates()
            .and_then(|chain| chain.first())
            .expect("the server presented a certificate")
            .as_ref()
            .to_vec();
        let io = TokioIo::new(tls);
        let (sender, connection) = if negotiated.as_deref() == Some(b"h2".as_slice()) {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io).await.expect("HTTP/2 handshake");
            (
                Sender::H2(sender),
                tokio::spawn(async move {
                    let _ = conn.await;
                }),
            )
        } else {
            let (sender, conn) = http1::handshake(io).await.expect("HTTP/1.1 handshake");
            (
                Sender::H1(sender),
                tokio::spawn(async move {
                    let _ = conn.await;
                }),
            )
        };
        Client {
            sender,
            authority: format!("localhost:{}", addr.port()),
            alpn: negotiated,
            leaf,
            connection,
            requests: 0,
        }
    }

    fn assert_alpn(&self, alpn: Alpn) {
        assert_eq!(
            self.alpn.as_deref(),
            Some(alpn.protocol()),
            "ALPN negotiated {:?}, asked for {:?}",
            self.alpn.as_deref().map(String::from_utf8_lossy),
            String::from_utf8_lossy(alpn.protocol())
        );
    }

    fn is_closed(&self) -> bool {
        match &self.sender {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    async fn request(&mut self, method: Method, path: &str, body: Vec<u8>) -> Resp {
        let h2 = matches!(self.sender, Sender::H2(_));
        let mut builder = Request::builder().method(method.clone());
        builder = if h2 {
            builder.uri(format!("https://{}{path}", self.authority))
        } else {
            builder.uri(path).header(HOST, &self.authority)
        };
        if !body.is_empty() {
            builder = builder.header(CONTENT_TYPE, "application/json");
        }
        let request = builder.body(Full::new(Bytes::from(body))).expect("request");
        let what = format!("{method} {path} (request #{} on this connection)", self.requests + 1);
        let send = async {
            let response = match &mut self.sender {
                Sender::H1(s) => {
                    s.ready().await.map_err(|e| format!("connection not ready: {e}"))?;
                    s.send_request(request).await
                }
                Sender::H2(s) => {
                    s.ready().await.map_err(|e| format!("connection not ready: {e}"))?;
                    s.send_request(request).await
                }
            }
            .map_err(|e| format!("{e:?}"))?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(|e| format!("reading the body: {e}"))?.to_bytes();
            Ok::<_, String>(Resp { status: parts.status, version: parts.version, headers: parts.headers, body })
        };
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, send)
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer within {REQUEST_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        self.requests += 1;
        resp
    }

    async fn get(&mut self, path: &str) -> Resp {
        self.request(Method::GET, path, Vec::new()).await
    }

    async fn post(&mut self, path: &str, review: &Value) -> Resp {
        self.request(Method::POST, path, serde_json::to_vec(review).expect("serialize")).await
    }

    /// POSTs a review and returns its `response`, checking the envelope on the way.
    async fn review(&mut self, path: &str, review: &Value) -> Value {
        let resp = self.post(path, review).await;
        assert_eq!(resp.status, StatusCode::OK, "POST {path}: {}", resp.text());
        assert_eq!(
            resp.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "POST {path}: content type"
        );
        let body = resp.json();
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1", "{body}");
        assert_eq!(body["kind"], "AdmissionReview", "{body}");
        let response = body["response"].clone();
        assert_eq!(response["uid"], review["request"]["uid"], "the response must carry the request's uid: {body}");
        assert!(response["allowed"].is_boolean(), "allowed must be a boolean: {body}");
        response
    }
}

/// A TLS connection to `addr`, verified as `server_name` against the CA in `ca` only.
async fn tls_connect(addr: SocketAddr, ca: &Path, server_name: &str, alpn: Alpn) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    // Without this every request waits ~40 ms for a delayed ACK (Nagle).
    tcp.set_nodelay(true).expect("TCP_NODELAY");
    let name = ServerName::try_from(server_name.to_string()).expect("server name");
    tokio::time::timeout(REQUEST_TIMEOUT, TlsConnector::from(client_config(ca, alpn)).connect(name, tcp))
        .await
        .expect("TLS handshake timed out")
        .unwrap_or_else(|e| panic!("TLS handshake with {addr} as {server_name}: {e}"))
}

/// One plain HTTP/1.1 GET (the metrics address has no TLS).
async fn plain_get(addr: SocketAddr, path: &str) -> Resp {
    let get = async {
        let tcp = TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(tcp)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let request = Request::get(path)
            .header(HOST, addr.to_string())
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok::<_, String>(Resp { status: parts.status, version: parts.version, headers: parts.headers, body })
    };
    tokio::time::timeout(REQUEST_TIMEOUT, get)
        .await
        .unwrap_or_else(|_| panic!("GET http://{addr}{path}: no answer within {REQUEST_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Reviews and patches

fn fixture(name: &str) -> Value {
    let path = repo_path("tests/fixtures/admission-reviews").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn with_object(review: &Value, object: Value) -> Value {
    let mut review = review.clone();
    review["request"]["object"] = object;
    review
}

/// The JSON Patch of an allowed response, or `None` when it has none. Pins the wire format:
/// `patch` is a base64 string (not kube-core's array of bytes) and comes with `patchType`.
fn patch_of(response: &Value) -> Option<json_patch::Patch> {
    let patch = response.get("patch")?;
    assert_eq!(response["allowed"], true, "a patch on a response that is not allowed: {response}");
    assert_eq!(response["patchType"], "JSONPatch", "patchType: {response}");
    let encoded = patch.as_str().unwrap_or_else(|| panic!("patch must be a base64 string, got {patch}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap_or_else(|e| panic!("patch is not base64 ({e}): {encoded}"));
    Some(
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!("patch is not an RFC 6902 JSON Patch ({e}): {}", String::from_utf8_lossy(&bytes))
        }),
    )
}

fn assert_no_patch(response: &Value) {
    assert!(response.get("patch").is_none(), "expected no patch: {response}");
    assert!(response.get("patchType").is_none(), "patchType without a patch: {response}");
}

fn apply(object: &Value, patch: &json_patch::Patch) -> Value {
    let mut out = object.clone();
    json_patch::patch(&mut out, patch).unwrap_or_else(|e| panic!("the patch does not apply ({e}): {patch:?}"));
    out
}

fn as_pod(object: &Value) -> Pod {
    serde_json::from_value(object.clone()).unwrap_or_else(|e| panic!("the patched object is no longer a Pod: {e}"))
}

fn gpu_tolerations(pod: &Pod) -> usize {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    tolerations
        .into_iter()
        .flatten()
        .filter(|t| {
            t.key.as_deref() == Some("nvidia.com/gpu")
                && t.operator.as_deref() == Some("Exists")
                && t.effect.as_deref() == Some("NoSchedule")
                && t.value.is_none()
        })
        .count()
}

fn node_selector(pod: &Pod, key: &str) -> Option<String> {
    pod.spec.as_ref()?.node_selector.as_ref()?.get(key).cloned()
}

/// The value of the first sample of `name` whose labels contain every one of `labels`.
fn metric(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (metric_name, rest) = series.split_once('{').unwrap_or((series, ""));
        (metric_name == name && labels.iter().all(|l| rest.contains(l))).then(|| value.parse().ok())?
    })
}

// ---------------------------------------------------------------------------------------------
// Tests

/// The GPU Pod captured from the API server gets the GPU toleration, over both protocols; the
/// patch is base64, applies cleanly and is idempotent.
#[tokio::test]
async fn mutate_gpu_pod_over_http1_and_http2() {
    allot::install_crypto_provider();
    let server = Server::start(&[]);
    let review = fixture("010-mutate-create-pod-my-gpu-pod.json");
    let original = review["request"]["object"].clone();
    assert_eq!(as_pod(&original).metadata.namespace.as_deref(), Some("vision"));
    assert_eq!(gpu_tolerations(&as_pod(&original)), 0, "the fixture must start without the toleration");

    for alpn in [Alpn::H1, Alpn::H2] {
        let mut client = server.connect(alpn).await;
        client.assert_alpn(alpn);

        let response = client.review("/mutate", &review).await;
        assert_eq!(response["allowed"], true, "{response}");
        assert!(response.get("status").is_none(), "{response}");
        let patch = patch_of(&response).expect("the GPU pod must be patched");
        let mutated = apply(&original, &patch);
        let pod = as_pod(&mutated);
        assert_eq!(gpu_tolerations(&pod), 1, "exactly one nvidia.com/gpu toleration: {mutated}");
        let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref()).expect("tolerations");
        assert_eq!(tolerations.len(), 3, "the two tolerations the API server added stay: {tolerations:?}");
        assert_eq!(node_selector(&pod, "node-type"), None, "the shipped policy sets no nodeSelector");

        // The API server reinvokes the webhook on its own output (reinvocationPolicy: IfNeeded).
        let again = client.review("/mutate", &with_object(&review, mutated.clone())).await;
        assert_eq!(again["allowed"], true, "{again}");
        assert_no_patch(&again);

        let resp = client.get("/healthz").await;
        assert_eq!(resp.status, StatusCode::OK);
        assert_eq!(resp.version, alpn.version(), "responses must come over the negotiated protocol");
        assert_eq!(client.requests, 3);
        assert!(!client.is_closed(), "{alpn:?}: the connection must stay open");
    }
}

/// The API server's in-cluster path: many requests on one keep-alive HTTP/1.1 connection.
#[tokio::test]
async fn keep_alive_http1_carries_many_requests() {
    allot::install_crypto_provider();
    let server = Server::start(&[]);
    let mut client = server.connect(Alpn::H1).await;
    client.assert_alpn(Alpn::H1);
    let mutate = fixture("010-mutate-create-pod-my-gpu-pod.json");
    let validate = fixture("011-validate-create-pod-my-gpu-pod.json");
    let mut latencies = Vec::new();
    for i in 0..20 {
        let (path, review) = if i % 2 == 0 { ("/mutate", &mutate) } else { ("/validate", &validate) };
        let started = Instant::now();
        let resp = client.post(path, review).await;
        latencies.push(started.elapsed());
        assert_eq!(resp.status, StatusCode::OK, "request {i}: {}", resp.text());
        assert_eq!(resp.version, Version::HTTP_11);
        let connection = resp.headers.get(CONNECTION).and_then(|v| v.to_str().ok()).unwrap_or("");
        assert!(!connection.eq_ignore_ascii_case("close"), "request {i}: the server asked to close the connection");
        assert!(!client.is_closed(), "request {i}: the connection closed");
        assert_eq!(resp.json()["response"]["allowed"], true, "request {i}: {}", resp.text());
    }
    assert_eq!(client.requests, 20, "all requests went over the one connection");
    // A request that waits for a delayed ACK (Nagle on either side) takes ~40 ms; an answer from
    // a debug build on loopback takes about 1 ms. The median ignores a stray scheduling hiccup.
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    assert!(median < Duration::from_millis(20), "median keep-alive request took {median:?}: {latencies:?}");
    assert!(!client.connection.is_finished(), "the connection task ended");
}

/// The Job whose GPU request differs from its limit is denied at /validate with the rule and the
/// path; fine Pods are allowed.
#[tokio::test]
async fn validate_denies_bad_gpu_job_and_admits_good_pods() {
    allot::install_crypto_provider();
    let server = Server::start(&[]);
    let mut client = server.connect(Alpn::H1).await;

    // Captured at the mutating webhook; only the URL changes.
    let bad = fixture("007-mutate-create-job-bad-gpu.json");
    let response = client.review("/validate", &bad).await;
    assert_eq!(response["allowed"], false, "{response}");
    assert_no_patch(&response);
    let status = &response["status"];
    assert_eq!(status["code"], 403, "{response}");
    let message = status["message"].as_str().unwrap_or_else(|| panic!("status.message: {response}"));
    assert!(message.contains("accelerators/requests-equal-limits"), "message names the rule: {message}");
    assert!(message.contains("spec.template.spec.containers[0]"), "message names the path: {message}");
    assert!(message.contains("nlp/bad-gpu"), "message names the object: {message}");

    for name in ["011-validate-create-pod-my-gpu-pod.json", "013-validate-create-pod-plain-cpu-pod.json"] {
        let response = client.review("/validate", &fixture(name)).await;
        assert_eq!(response["allowed"], true, "{name}: {response}");
        assert!(response.get("status").is_none(), "{name}: {response}");
        assert_no_patch(&response);
    }

    // The same GPU Pod, once mutated, still validates.
    let review = fixture("010-mutate-create-pod-my-gpu-pod.json");
    let patch = patch_of(&client.review("/mutate", &review).await).expect("patch");
    let mutated = apply(&review["request"]["object"], &patch);
    let response = client.review("/validate", &with_object(&review, mutated)).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(!client.is_closed());
}

/// Malformed, oversized and unknown input get clear answers, and the server keeps serving.
#[tokio::test]
async fn bad_input_gets_clear_answers() {
    allot::install_crypto_provider();
    let limit = 64 * 1024;
    let server = Server::start(&["--max-body-bytes", &limit.to_string()]);
    let review = fixture("010-mutate-create-pod-my-gpu-pod.json");

    for alpn in [Alpn::H1, Alpn::H2] {
        let mut client = server.connect(alpn).await;
        client.assert_alpn(alpn);

        let resp = client.request(Method::POST, "/mutate", b"{\"apiVersion\": ".to_vec()).await;
        assert_eq!(resp.status, StatusCode::BAD_REQUEST, "{alpn:?} malformed JSON: {}", resp.text());
        assert!(resp.text().contains("invalid JSON"), "{alpn:?} 400 body gives the reason: {:?}", resp.text());

        let mut not_a_review = review.clone();
        not_a_review["kind"] = json!("ConfigMap");
        let resp = client.post("/validate", &not_a_review).await;
        assert_eq!(resp.status, StatusCode::BAD_REQUEST, "{alpn:?} not an AdmissionReview: {}", resp.text());
        assert!(resp.text().contains("AdmissionReview"), "{alpn:?}: {:?}", resp.text());

        // A well-formed review of a kind Allot knows nothing about: allowed, untouched.
        let mut widget = review.clone();
        widget["request"]["kind"] = json!({"group": "example.com", "version": "v1", "kind": "Widget"});
        widget["request"]["resource"] = json!({"group": "example.com", "version": "v1", "resource": "widgets"});
        widget["request"]["object"]["apiVersion"] = json!("example.com/v1");
        widget["request"]["object"]["kind"] = json!("Widget");
        for path in ["/mutate", "/validate"] {
            let response = client.review(path, &widget).await;
            assert_eq!(response["allowed"], true, "{alpn:?} {path} Widget: {response}");
            assert_no_patch(&response);
            assert!(response.get("status").is_none(), "{response}");
        }

        // Still answering on the same connection.
        let response = client.review("/mutate", &review).await;
        assert!(patch_of(&response).is_some(), "{alpn:?}: {response}");
        assert_eq!(client.requests, 5);
    }

    // Larger than --max-body-bytes, though otherwise a fine review: 413, whichever protocol.
    // Only a little larger: over HTTP/1.1 the server answers once it has read `limit` bytes and
    // then closes without reading the rest, so a client still writing a body far over the limit
    // (5 MiB against 4 MiB) gets EPIPE instead of the 413 about one time in five. A body that
    // fits in the socket buffers is fully sent before the answer comes.
    let mut big = review.clone();
    big["request"]["object"]["metadata"]["annotations"]["padding"] = json!("x".repeat(limit + 4096));
    let big = serde_json::to_vec(&big).expect("serialize");
    assert!(big.len() > limit);
    for alpn in [Alpn::H1, Alpn::H2] {
        let mut client = server.connect(alpn).await;
        let resp = client.request(Method::POST, "/mutate", big.clone()).await;
        assert_eq!(resp.status, StatusCode::PAYLOAD_TOO_LARGE, "{alpn:?}: {}", resp.text());
        // The server still answers (a new connection: HTTP/1.1 cannot reuse one whose request
        // body was not read).
        let mut client = server.connect(alpn).await;
        let response = client.review("/mutate", &review).await;
        assert!(patch_of(&response).is_some(), "{alpn:?} after 413: {response}");
    }

    let metrics = server.metrics_text().await;
    let errors = metric(&metrics, "allot_admission_requests_total", &[r#"webhook="mutate""#, r#"result="error""#]);
    assert!(errors >= Some(2.0), "malformed reviews are counted: {metrics}");
}

/// A client that stops sending halfway through its body is cut off by the request deadline
/// (503) instead of holding the request open: the deadline covers reading the body.
#[tokio::test]
async fn stalled_body_hits_the_request_deadline() {
    allot::install_crypto_provider();
    let server = Server::start(&["--request-timeout-ms", "300"]);
    let mut tls = tls_connect(server.https, &server.certs().join("ca.crt"), "localhost", Alpn::H1).await;
    // Headers promise 4 KiB; only the first bytes of the body come.
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: localhost:{}\r\ncontent-type: application/json\r\ncontent-length: 4096\r\n\r\n{{\"apiVersion\": ",
        server.https.port()
    );
    tls.write_all(head.as_bytes()).await.expect("write the request head");
    tls.flush().await.expect("flush");
    let started = Instant::now();
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 1024];
        while !received.windows(4).any(|w| w == b"\r\n\r\n") {
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    let elapsed = started.elapsed();
    let text = String::from_utf8_lossy(&received);
    assert!(read.is_ok(), "no answer {elapsed:?} into a stalled body; got {text:?}");
    assert!(text.starts_with("HTTP/1.1 503"), "a stalled body gets 503, got {text:?} after {elapsed:?}");
    assert!(elapsed >= Duration::from_millis(250), "answered before the deadline ({elapsed:?}): {text:?}");
    assert!(elapsed < Duration::from_secs(3), "the deadline is 300 ms, the answer took {elapsed:?}");

    // The server is still fine.
    let mut client = server.connect(Alpn::H1).await;
    let response = client.review("/mutate", &fixture("010-mutate-create-pod-my-gpu-pod.json")).await;
    assert!(patch_of(&response).is_some(), "{response}");
}

/// Probes on both ports, and the Prometheus metrics.
#[tokio::test]
async fn probes_and_metrics() {
    allot::install_crypto_provider();
    let server = Server::start(&[]);
    let mut client = server.connect(Alpn::H1).await;

    let healthz = client.get("/healthz").await;
    assert_eq!((healthz.status, healthz.text().trim()), (StatusCode::OK, "ok"));
    let readyz = client.get("/readyz").await;
    assert_eq!(readyz.status, StatusCode::OK, "{}", readyz.text());
    let ready_text = readyz.text();
    assert!(ready_text.starts_with("ok: policy set "), "{ready_text}");
    assert!(!ready_text.contains("failed"), "{ready_text}");
    let version = ready_text["ok: policy set ".len()..].split_whitespace().next().expect("version").to_string();

    let healthz = server.metrics_get("/healthz").await;
    assert_eq!((healthz.status, healthz.text().trim()), (StatusCode::OK, "ok"));
    let readyz = server.metrics_get("/readyz").await;
    assert_eq!(readyz.status, StatusCode::OK);
    assert_eq!(readyz.text(), ready_text, "both ports report the same readiness");

    // /metrics is not served on the webhook port.
    assert_eq!(client.get("/metrics").await.status, StatusCode::NOT_FOUND);

    let before = server.metrics_text().await;
    assert!(
        metric(&before, "allot_policy_set_info", &[&format!(r#"version="{version}""#)]) == Some(1.0),
        "allot_policy_set_info names the version /readyz reports ({version}): {before}"
    );
    let mutated = |text: &str| {
        metric(text, "allot_admission_requests_total", &[r#"webhook="mutate""#, r#"result="mutated""#]).unwrap_or(0.0)
    };
    let review = fixture("010-mutate-create-pod-my-gpu-pod.json");
    for _ in 0..3 {
        assert!(patch_of(&client.review("/mutate", &review).await).is_some());
    }
    assert_eq!(client.review("/validate", &fixture("007-mutate-create-job-bad-gpu.json")).await["allowed"], false);

    let after = server.metrics_text().await;
    assert_eq!(mutated(&after) - mutated(&before), 3.0, "{after}");
    assert!(
        metric(&after, "allot_admission_requests_total", &[r#"webhook="validate""#, r#"result="denied""#]) >= Some(1.0),
        "{after}"
    );
    assert!(
        metric(
            &after,
            "allot_admission_decisions_total",
            &[r#"rule="accelerators/requests-equal-limits""#, r#"action="deny""#]
        ) >= Some(1.0),
        "{after}"
    );
    assert!(metric(&after, "allot_admission_duration_seconds_count", &[r#"webhook="mutate""#]) >= Some(3.0), "{after}");
    assert!(after.trim_end().ends_with("# EOF"), "OpenMetrics text ends with # EOF");
}

/// A log pipe nobody reads (a stalled collector, a full node disk) never stalls admission:
/// with 64 Warn rules firing on every review, 600 reviews log 38,400 lines (over 200 bytes
/// each), far past the pipe's buffer and the server's 4 MiB; every review is still answered,
/// with its 64 warnings, and the lines that could not be buffered are counted in
/// `allot_log_lines_dropped_total`. (Written directly, the server blocked on its first full pipe
/// write: a few reviews in.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_pipe_nobody_reads_never_stalls_admission() {
    allot::install_crypto_provider();
    const RULES: usize = 64;
    const REVIEWS: usize = 600;
    let dir = shipped_dir();
    let policies = dir.path().join("policies");
    let noisy: Vec<String> = (0..RULES)
        .map(|i| {
            format!(
                "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {{name: noisy-{i}}}\nspec:\n  expression: \"false\"\n  message: noisy rule {i} fires on every pod\n  action: Warn\n"
            )
        })
        .collect();
    std::fs::write(policies.join("noisy.yaml"), noisy.join("---\n")).expect("write noisy.yaml");
    let server = Server::start_with_stderr_unread(dir, &[]);
    let review = fixture("011-validate-create-pod-my-gpu-pod.json");
    let started = Instant::now();
    let mut client = server.connect(Alpn::H1).await;
    for i in 0..REVIEWS {
        let response =
            tokio::time::timeout(REQUEST_TIMEOUT, client.review("/validate", &review)).await.unwrap_or_else(|_| {
                panic!("review {i} not answered within {REQUEST_TIMEOUT:?}: admission waits on stderr")
            });
        assert_eq!(response["allowed"], true, "review {i}: {response}");
        let warnings = response["warnings"]
            .as_array()
            .map_or(0, |w| w.iter().filter(|w| w.to_string().contains("noisy rule")).count());
        assert_eq!(warnings, RULES, "review {i} carries every noisy rule's warning: {response}");
    }
    let elapsed = started.elapsed();
    let metrics = server.metrics_text().await;
    let dropped =
        metric(&metrics, "allot_log_lines_dropped_total", &[]).expect("the dropped-lines counter is exported");
    let logged = (RULES * REVIEWS) as f64;
    // What the buffer and the pipe took is kept (under 4.1 MiB; ~220 bytes a line here, so
    // about 19,500 lines, at most 23,000 even at 190 bytes); the rest is counted.
    assert!(dropped >= logged - 23_000.0 && dropped < logged, "{dropped} of {logged} lines dropped: {metrics}");
    eprintln!(
        "{REVIEWS} reviews with {RULES} warnings each in {elapsed:?} with stderr unread; {dropped} lines dropped"
    );
}

/// The server formats a mutation's change descriptions only for its debug log line: at debug
/// level they are there, and the patch is the same either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutation_changes_are_described_in_the_debug_log() {
    allot::install_crypto_provider();
    let review = fixture("010-mutate-create-pod-my-gpu-pod.json");
    let mut patches = Vec::new();
    for filter in ["info,allot=debug", "info"] {
        let server = Server::start_logging(filter);
        let mut client = server.connect(Alpn::H1).await;
        let response = client.review("/mutate", &review).await;
        assert_eq!(response["allowed"], true, "{response}");
        patches.push(response["patch"].clone());
        let srv = &server;
        if filter.contains("debug") {
            eventually("the debug line of the mutation", Duration::from_secs(5), || async move {
                let log = srv.stderr();
                match log.lines().find(|l| l.contains("mutated") && l.contains("changes=")) {
                    Some(line) if line.contains("add toleration nvidia.com/gpu") => Ok(()),
                    _ => Err(log),
                }
            })
            .await;
        } else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!server.stderr().contains("changes="), "no debug line at info: {}", server.stderr());
        }
    }
    assert!(patches[0].is_string(), "fixture 010 is mutated: {}", patches[0]);
    assert_eq!(patches[0], patches[1], "describing the changes does not change the patch");
}

/// A rule whose evaluation panics (the `allotTestPanic` hook of the test-hooks build) costs that
/// rule's verdict only: the real binary answers well-formed AdmissionReviews over HTTPS on the
/// same connection, denies for a Deny rule, warns for a Warn rule, counts the panics in
/// `allot_rule_evaluation_panics_total{rule}` and logs each rule's panic once, as one line.
#[tokio::test]
async fn a_panicking_rule_is_contained_counted_and_logged_once() {
    allot::install_crypto_provider();
    let server = Server::start(&[]);
    std::fs::write(
        server.policies().join("panics.yaml"),
        "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: panics-deny}\nspec:\n  expression: allotTestPanic(object)\n  message: m\n  action: Deny\n---\napiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: panics-warn}\nspec:\n  expression: allotTestPanic(object)\n  message: m\n  action: Warn\n",
    )
    .expect("write panics.yaml");
    let srv = &server;
    eventually("the panicking rules are loaded", RELOAD_DEADLINE, || async move {
        let text = srv.metrics_get("/readyz").await.text();
        if text.contains("failed") {
            panic!("the test-hooks build must accept allotTestPanic: {text}");
        }
        if text.contains("panics-deny")
            || srv.metrics_text().await.contains("allot_policy_reloads_total{result=\"success\"} 1")
        {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
    let review = fixture("011-validate-create-pod-my-gpu-pod.json");
    let mut client = server.connect(Alpn::H1).await;
    for _ in 0..3 {
        let response = client.review("/validate", &review).await;
        assert_eq!(response["allowed"], false, "a Deny rule that panics denies: {response}");
        let message = response["status"]["message"].as_str().expect("a status message");
        assert!(message.contains("panics-deny") && message.contains("panicked"), "{message}");
        let warnings = response["warnings"].to_string();
        assert!(warnings.contains("panics-warn") && warnings.contains("panicked"), "{warnings}");
    }
    assert!(!client.is_closed(), "a panic does not drop the connection");
    let metrics = server.metrics_text().await;
    for rule in ["panics-deny", "panics-warn"] {
        let count = metric(&metrics, "allot_rule_evaluation_panics_total", &[&format!("rule=\"{rule}\"")]);
        assert_eq!(count, Some(3.0), "{rule}: {metrics}");
    }
    // The server writes its log lines in batches (within ~20 ms): wait for them, then long
    // enough for any third one to have come.
    let panic_lines = |stderr: &str| stderr.lines().filter(|l| l.contains("rule evaluation panicked")).count();
    eventually("the panics are logged", Duration::from_secs(5), || async {
        let stderr = srv.stderr();
        if panic_lines(&stderr) >= 2 { Ok(()) } else { Err(stderr) }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stderr = server.stderr();
    let logged: Vec<&str> = stderr.lines().filter(|l| l.contains("rule evaluation panicked")).collect();
    assert_eq!(logged.len(), 2, "one line per rule, not per request: {stderr}");
    assert!(logged.iter().any(|l| l.contains("panics-deny")) && logged.iter().any(|l| l.contains("panics-warn")));
    assert!(!stderr.contains("stack backtrace") && !stderr.contains("thread '"), "no raw panic output: {stderr}");
}

/// Policies reload when their files change; a broken file keeps the last good set in force and
/// is reported until fixed.
#[tokio::test]
async fn policies_hot_reload_and_broken_files_keep_the_last_good_set() {
    allot::install_crypto_provider();
    let server = Server::start(&[]);
    let review = fixture("010-mutate-create-pod-my-gpu-pod.json");
    let object = review["request"]["object"].clone();
    let placement = server.policies().join("placement.yaml");
    let shipped = std::fs::read_to_string(&placement).expect("placement.yaml");
    let commented = "  # nodeSelector:\n  #   node-type: my-precious\n";
    assert!(shipped.contains(commented), "policies/placement.yaml changed; update this test");
    let pinned = shipped.replacen(commented, "  nodeSelector:\n    node-type: my-precious\n", 1);

    // The selector is not there to begin with.
    let mut client = server.connect(Alpn::H1).await;
    let pod = as_pod(&apply(&object, &patch_of(&client.review("/mutate", &review).await).expect("patch")));
    assert_eq!(node_selector(&pod, "node-type"), None);

    replace_file(&placement, &pinned);
    let started = Instant::now();
    let (srv, rv, obj) = (&server, &review, &object);
    eventually("the edited Placement takes effect", RELOAD_DEADLINE, || async move {
        let response = srv.connect(Alpn::H1).await.review("/mutate", rv).await;
        let pod = as_pod(&apply(obj, &patch_of(&response).ok_or_else(|| response.to_string())?));
        assert_eq!(gpu_tolerations(&pod), 1);
        match node_selector(&pod, "node-type") {
            Some(v) if v == "my-precious" => Ok(()),
            other => Err(format!("nodeSelector node-type = {other:?}")),
        }
    })
    .await;
    eprintln!("policy reload took {:?}", started.elapsed());
    let good_ready = server.metrics_get("/readyz").await.text();
    assert!(!good_ready.contains("failed"), "{good_ready}");

    // An unknown field, a YAML syntax error, then a nodeSelector key the API server would refuse
    // in every Pod: all rejected, the edited set stays. Each names what /readyz must report.
    let broken_files = [
        (
            "unknown field",
            pinned.replacen("  onConflict: Deny\n", "  onConflict: Deny\n  tolerateEverything: true\n", 1),
            "tolerateEverything",
        ),
        (
            "invalid YAML",
            format!("{pinned}\n---\napiVersion: allot.dev/v1alpha1\nkind: Placement\nspec: [unclosed\n"),
            "invalid YAML",
        ),
        (
            "a nodeSelector key the API server refuses",
            pinned.replacen("    node-type: my-precious\n", "    example.com/pool~x: my-precious\n", 1),
            "spec.nodeSelector: Invalid value: \"example.com/pool~x\"",
        ),
        // A stray pair of braces makes a message literal the CEL engine cannot evaluate.
        (
            "message literal",
            format!(
                "{pinned}\n---\napiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {{name: typo}}\nspec:\n  expression: \"object.spec.containers.all(c, c.image{{}}.contains(':'))\"\n  message: pin your images\n  action: Warn\n"
            ),
            "(Rule typo)",
        ),
    ];
    for (i, (what, broken, marker)) in broken_files.iter().enumerate() {
        assert_ne!(broken, &pinned, "{what}: the edit must change the file");
        replace_file(&placement, broken);
        let ready = eventually(&format!("{what}: /readyz reports the failure"), RELOAD_DEADLINE, || async move {
            let resp = srv.metrics_get("/readyz").await;
            let text = resp.text();
            if resp.status != StatusCode::OK {
                panic!("{what}: /readyz must stay 200 while the last good set serves: {} {text}", resp.status);
            }
            let failures = metric(&srv.metrics_text().await, "allot_policy_reloads_total", &[r#"result="failure""#]);
            // Each broken version is reported in turn (the unknown field only by the first).
            let this_one = (i == 0) == text.contains("tolerateEverything") && text.contains(*marker);
            if text.contains("last reload failed") && this_one && failures >= Some((i + 1) as f64) {
                Ok(text)
            } else {
                Err(format!("{failures:?} failed reloads; /readyz: {text}"))
            }
        })
        .await;
        assert!(ready.contains("placement.yaml"), "the report names the file: {ready}");
        if *what == "message literal" {
            assert!(ready.contains("(Rule typo): spec.expression: `c.image{}`"), "{ready}");
        }
        assert!(ready.starts_with(good_ready.lines().next().expect("first line")), "still the edited set: {ready}");
        let https_ready = client.get("/readyz").await;
        assert_eq!(https_ready.status, StatusCode::OK);
        assert!(https_ready.text().contains("last reload failed"), "{}", https_ready.text());

        let response = client.review("/mutate", &review).await;
        let pod = as_pod(&apply(&object, &patch_of(&response).expect("patch")));
        assert_eq!(
            node_selector(&pod, "node-type").as_deref(),
            Some("my-precious"),
            "{what}: the last good set stays in force"
        );
        assert_eq!(gpu_tolerations(&pod), 1);
    }
    let metrics = server.metrics_text().await;
    let failures = metric(&metrics, "allot_policy_reloads_total", &[r#"result="failure""#]);
    assert!(failures >= Some(3.0), "three failed reloads counted: {metrics}");
    assert!(metric(&metrics, "allot_policy_load_errors", &[]) >= Some(1.0), "{metrics}");

    // Fixed: the report goes away.
    replace_file(&placement, &pinned);
    eventually("/readyz stops reporting the failure", RELOAD_DEADLINE, || async move {
        let text = srv.metrics_get("/readyz").await.text();
        if text.contains("failed") { Err(text) } else { Ok(()) }
    })
    .await;
    let metrics = server.metrics_text().await;
    assert_eq!(metric(&metrics, "allot_policy_load_errors", &[]), Some(0.0), "{metrics}");
    let response = client.review("/mutate", &review).await;
    let pod = as_pod(&apply(&object, &patch_of(&response).expect("patch")));
    assert_eq!(node_selector(&pod, "node-type").as_deref(), Some("my-precious"));
    assert!(!client.is_closed(), "reloads do not drop connections");
}

/// `allot certs` run again (same CA) rotates the serving certificate without a restart.
#[tokio::test]
async fn serving_certificate_rotates_without_restart() {
    allot::install_crypto_provider();
    let server = Server::start(&[]);
    let ca_path = server.certs().join("ca.crt");
    let ca_before = std::fs::read(&ca_path).expect("ca.crt");
    let mut old = server.connect(Alpn::H1).await;
    old.assert_alpn(Alpn::H1);
    // The IP SAN works as well as the DNS name.
    let by_ip = Client::connect(server.https, &ca_path, "127.0.0.1", Alpn::H2).await;
    by_ip.assert_alpn(Alpn::H2);
    assert_eq!(by_ip.leaf, old.leaf);

    make_certs(&server.certs());
    assert_eq!(std::fs::read(&ca_path).expect("ca.crt"), ca_before, "allot certs must reuse the CA");
    let started = Instant::now();
    // Each attempt is a fresh TLS connection (no resumption) trusting only the original CA.
    let (srv, old_leaf) = (&server, &old.leaf);
    let mut fresh = eventually("a new connection sees the new certificate", RELOAD_DEADLINE, || async move {
        let client = srv.connect(Alpn::H2).await;
        if &client.leaf != old_leaf { Ok(client) } else { Err("still the old certificate".to_string()) }
    })
    .await;
    eprintln!("certificate rotation took {:?}", started.elapsed());
    fresh.assert_alpn(Alpn::H2);
    assert_eq!(fresh.get("/healthz").await.status, StatusCode::OK);
    let new_cert = CertificateDer::from_pem_file(server.certs().join("tls.crt")).expect("tls.crt");
    assert_eq!(fresh.leaf, new_cert.as_ref(), "the server presents the certificate now on disk");

    // HTTP/1.1 sees it too, and the connection opened before the rotation keeps working.
    let fresh_h1 = server.connect(Alpn::H1).await;
    fresh_h1.assert_alpn(Alpn::H1);
    assert_eq!(fresh_h1.leaf, fresh.leaf);
    let response = old.review("/mutate", &fixture("010-mutate-create-pod-my-gpu-pod.json")).await;
    assert!(patch_of(&response).is_some());

    let metrics = server.metrics_text().await;
    assert!(
        metric(&metrics, "allot_certificate_reloads_total", &[r#"result="success""#]) >= Some(1.0),
        "certificate reloads are counted: {metrics}"
    );
}

/// Lays `files` out the way the kubelet's AtomicWriter projects a ConfigMap or Secret volume:
/// the data in a hidden timestamped directory, `..data` a symlink to it, and each visible name a
/// symlink through `..data`. A later call swaps `..data` atomically (rename of a new symlink)
/// and removes the old directory: the visible paths never change, only what they resolve to.
fn project_volume(dir: &Path, generation: u32, files: &[(&str, Vec<u8>)]) {
    std::fs::create_dir_all(dir).expect("volume directory");
    let data = format!("..2026_11_22_00_00_{generation:02}.000000001");
    std::fs::create_dir(dir.join(&data)).expect("data directory");
    for (name, contents) in files {
        std::fs::write(dir.join(&data).join(name), contents).expect("write projected file");
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(&data, dir.join("..data_tmp")).expect("symlink ..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    for (name, _) in files {
        let visible = dir.join(name);
        if std::fs::symlink_metadata(&visible).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &visible).expect("visible symlink");
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).expect("remove the old data directory");
    }
}

/// In a cluster, policies come from a ConfigMap volume and certificates from a Secret volume
/// (cert-manager or `allot certs` rotating them): both reach the server through a `..data`
/// symlink swap, which must be picked up without a restart, like a plain file replacement.
#[tokio::test]
async fn configmap_and_secret_volume_updates_are_picked_up() {
    allot::install_crypto_provider();
    let dir = tempfile::tempdir().expect("temporary directory");
    let staging = dir.path().join("staging");
    make_certs(&staging);
    let read = |name: &str| std::fs::read(staging.join(name)).expect("generated certificate file");
    let policy_files = |extra: &str| -> Vec<(&'static str, Vec<u8>)> {
        let mut files: Vec<(&'static str, Vec<u8>)> =
            ["cluster.yaml", "placement.yaml", "teams.yaml", "rules.yaml", "gangs.yaml"]
                .into_iter()
                .map(|f| (f, std::fs::read(repo_path("policies").join(f)).expect("shipped policy")))
                .collect();
        if !extra.is_empty() {
            files.push(("extra.yaml", extra.as_bytes().to_vec()));
        }
        files
    };
    project_volume(&dir.path().join("policies"), 1, &policy_files(""));
    // Like a cert-manager Secret: ca.crt, tls.crt, tls.key.
    let secret = || [("ca.crt", read("ca.crt")), ("tls.crt", read("tls.crt")), ("tls.key", read("tls.key"))];
    project_volume(&dir.path().join("certs"), 1, &secret());
    let server = Server::start_in(dir, &[]);
    let version_before = server.metrics_text().await;
    let version_before = version_before.lines().find(|l| l.starts_with("allot_policy_set_info{")).map(String::from);
    let old_leaf = server.connect(Alpn::H1).await.leaf;

    // A new ConfigMap version adds a rule that denies every Pod in namespace "frozen".
    let rule = "apiVersion: allot.dev/v1alpha1\nkind: Rule\nmetadata: {name: frozen-namespace}\nspec:\n  match: {kinds: [Pod], namespaces: [frozen]}\n  expression: 'false'\n  message: namespace frozen takes no new pods\n";
    project_volume(&server.policies(), 2, &policy_files(rule));
    let (srv, version_before) = (&server, &version_before);
    eventually("the projected policy update to be served", RELOAD_DEADLINE, || async move {
        let text = srv.metrics_text().await;
        let now = text.lines().find(|l| l.starts_with("allot_policy_set_info{")).map(String::from);
        if now.is_some() && &now != version_before { Ok(()) } else { Err(format!("still {now:?}")) }
    })
    .await;
    let mut review = fixture("015-validate-create-pod-tolerated-gpu-pod.json");
    review["request"]["namespace"] = json!("frozen");
    review["request"]["object"]["metadata"]["namespace"] = json!("frozen");
    let response = server.connect(Alpn::H1).await.review("/validate", &review).await;
    assert_eq!(response["allowed"], false, "{response}");
    assert!(response["status"]["message"].as_str().unwrap_or("").contains("frozen-namespace"), "{response}");

    // cert-manager renews the Secret: a new serving certificate from the same CA.
    make_certs(&staging);
    project_volume(&server.certs(), 2, &secret());
    let fresh = eventually("a new connection sees the renewed certificate", RELOAD_DEADLINE, || async {
        let client = server.connect(Alpn::H1).await;
        if client.leaf != old_leaf { Ok(client) } else { Err("still the old certificate".to_string()) }
    })
    .await;
    assert_eq!(fresh.leaf, CertificateDer::from_pem_file(server.certs().join("tls.crt")).expect("tls.crt").as_ref());
}

/// SIGTERM: the process exits successfully and promptly, closing idle keep-alive connections
/// instead of waiting out the grace period (kubernetes#127335).
#[tokio::test]
async fn sigterm_closes_idle_connections_and_exits() {
    allot::install_crypto_provider();
    // A grace period far longer than the deadline below: only closing idle connections at once
    // lets the process exit in time.
    let mut server = Server::start(&["--shutdown-grace-secs", "30"]);
    let review = fixture("010-mutate-create-pod-my-gpu-pod.json");
    let mut h1 = server.connect(Alpn::H1).await;
    let mut h2 = server.connect(Alpn::H2).await;
    assert_eq!(h1.review("/mutate", &review).await["allowed"], true);
    assert_eq!(h2.get("/healthz").await.status, StatusCode::OK);
    assert!(!h1.is_closed() && !h2.is_closed(), "both connections are open and idle");

    let started = Instant::now();
    let kill = Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().expect("run kill");
    assert!(kill.success(), "kill -TERM failed");
    let status = server.wait_exit(Duration::from_secs(5)).await;
    let elapsed = started.elapsed();
    let status = status.unwrap_or_else(|| panic!("allot serve still running {elapsed:?} after SIGTERM"));
    assert!(status.success(), "allot serve exited with {status} after SIGTERM");
    eprintln!("shutdown took {elapsed:?}");

    // The idle connections were closed by the server, not left hanging.
    tokio::time::timeout(Duration::from_secs(2), async {
        while !(h1.is_closed() && h2.is_closed()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the idle connections are closed");
    // The log reader may trail the exit by a moment.
    let logged_stop = tokio::time::timeout(Duration::from_secs(2), async {
        while !server.stderr().contains("stopped") {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert!(logged_stop.await.is_ok(), "logs say it stopped:\n{}", server.stderr());
    // stdout held the one address line and nothing else.
    let extra: Vec<String> = server.stdout.try_iter().collect();
    assert!(extra.is_empty(), "unexpected stdout lines: {extra:?}");
    assert!(TcpStream::connect(server.https).await.is_err(), "the webhook port is closed");
}

/// SIGTERM with a client stuck halfway through a request on the metrics port (a scrape cut off
/// by the network, a slow-loris): the process still exits within the grace period instead of
/// waiting for that connection forever.
#[tokio::test]
async fn sigterm_with_a_stuck_metrics_client_exits_within_the_grace_period() {
    allot::install_crypto_provider();
    let mut server = Server::start(&["--shutdown-grace-secs", "1"]);
    let mut stuck = TcpStream::connect(server.metrics).await.expect("connect to the metrics port");
    stuck.write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\n").await.expect("half a request head");
    // The same on the webhook port, past the TLS handshake.
    let mut stuck_tls = tls_connect(server.https, &server.certs().join("ca.crt"), "localhost", Alpn::H1).await;
    stuck_tls.write_all(b"POST /mutate HTTP/1.1\r\nhost: localhost\r\n").await.expect("half a request head");
    stuck_tls.flush().await.expect("flush");
    // Let the server read what was sent.
    assert_eq!(server.metrics_get("/healthz").await.status, StatusCode::OK);

    let started = Instant::now();
    let kill = Command::new("kill").args(["-TERM", &server.pid().to_string()]).status().expect("run kill");
    assert!(kill.success(), "kill -TERM failed");
    let status = server.wait_exit(Duration::from_secs(6)).await;
    let elapsed = started.elapsed();
    let status = status.unwrap_or_else(|| panic!("allot serve still running {elapsed:?} after SIGTERM (grace 1 s)"));
    assert!(status.success(), "allot serve exited with {status} after SIGTERM");
    drop((stuck, stuck_tls));
}

/// Startup errors end the process with a non-zero status and say what is wrong.
#[tokio::test]
async fn startup_errors_exit_non_zero_with_a_reason() {
    allot::install_crypto_provider();
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::create_dir(dir.path().join("policies")).expect("empty policy directory");
    make_certs(&dir.path().join("certs"));
    let (status, stderr) = run_to_exit(serve_command(dir.path(), &[]));
    assert!(!status.success(), "an empty policy directory must fail startup; stderr:\n{stderr}");
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no policy files"), "stderr names the problem:\n{stderr}");
    assert!(stderr.contains(&dir.path().join("policies").display().to_string()), "and the directory:\n{stderr}");

    // A policy file with an unknown field: the file and field are named.
    std::fs::write(
        dir.path().join("policies/bad.yaml"),
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata:\n  name: x\nspec:\n  namespaces:\n    names: [x]\n  quotaa: {}\n",
    )
    .expect("write bad.yaml");
    let (status, stderr) = run_to_exit(serve_command(dir.path(), &[]));
    assert!(!status.success(), "a broken policy must fail startup; stderr:\n{stderr}");
    assert!(stderr.contains("bad.yaml") && stderr.contains("quotaa"), "stderr names file and field:\n{stderr}");

    // Good policies, missing certificate.
    std::fs::remove_file(dir.path().join("policies/bad.yaml")).expect("remove bad.yaml");
    copy_dir(&repo_path("policies"), &dir.path().join("policies"));
    std::fs::remove_file(dir.path().join("certs/tls.crt")).expect("remove tls.crt");
    let (status, stderr) = run_to_exit(serve_command(dir.path(), &[]));
    assert!(!status.success(), "a missing certificate must fail startup; stderr:\n{stderr}");
    assert!(stderr.contains("tls.crt"), "stderr names the certificate file:\n{stderr}");
}

/// Runs a command that is expected to exit by itself; kills it after the startup timeout.
fn run_to_exit(mut cmd: Command) -> (ExitStatus, String) {
    let mut child = cmd.spawn().expect("spawn allot");
    let (stderr, reader) = collect_stderr(&mut child);
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            // The reader sees EOF once the process is gone.
            let _ = reader.join();
            return (status, stderr.lock().map(|s| s.clone()).unwrap_or_default());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "allot serve did not exit within {STARTUP_TIMEOUT:?}; stderr:\n{}",
                stderr.lock().map(|s| s.clone()).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 4: 200 reviews for one team in flight at once over HTTP/2, against a deny-mode quota
/// of 8 GPUs: exactly 8 are admitted; the API server's retries (same uid) are not charged twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_200_concurrent_reviews_never_exceeds_the_quota() {
    allot::install_crypto_provider();
    let dir = shipped_dir();
    let policies = dir.path().join("policies");
    std::fs::write(
        policies.join("zz-burst.yaml"),
        "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: burst}\nspec:\n  namespaces: {names: [burst]}\n  quota:\n    mode: Deny\n    limits: {nvidia.com/gpu: 8}\n",
    )
    .unwrap();
    let server = Server::start_in(dir, &[]);
    let ca = server.dir.path().join("certs/ca.crt");
    let base = fixture("011-validate-create-pod-my-gpu-pod.json");
    let review = |i: usize| {
        let mut r = base.clone();
        r["request"]["uid"] = json!(format!("burst-uid-{i}"));
        r["request"]["namespace"] = json!("burst");
        r["request"]["object"]["metadata"]["namespace"] = json!("burst");
        r["request"]["object"]["metadata"]["name"] = json!(format!("burst-{i}"));
        serde_json::to_vec(&r).unwrap()
    };
    let mut senders = Vec::new();
    for _ in 0..4 {
        let client = Client::connect(server.https, &ca, "localhost", Alpn::H2).await;
        client.assert_alpn(Alpn::H2);
        let Sender::H2(sender) = &client.sender else { panic!("expected HTTP/2") };
        senders.push((sender.clone(), client));
    }
    let authority = format!("localhost:{}", server.https.port());
    let mut tasks = Vec::new();
    for i in 0..200 {
        let mut sender = senders[i % 4].0.clone();
        let body = review(i);
        let uri = format!("https://{authority}/validate");
        tasks.push(tokio::spawn(async move {
            let request =
                Request::post(uri).header(CONTENT_TYPE, "application/json").body(Full::new(Bytes::from(body))).unwrap();
            sender.ready().await.expect("h2 ready");
            let response = sender.send_request(request).await.expect("response");
            assert_eq!(response.status(), StatusCode::OK);
            let bytes = response.into_body().collect().await.expect("body").to_bytes();
            let review: Value = serde_json::from_slice(&bytes).expect("JSON");
            review["response"].clone()
        }));
    }
    let mut admitted = 0;
    let mut denial = None;
    for t in tasks {
        let response = t.await.expect("task");
        if response["allowed"] == true {
            admitted += 1;
        } else {
            denial = Some(response["status"]["message"].as_str().unwrap_or_default().to_string());
        }
    }
    assert_eq!(admitted, 8, "exactly the quota is admitted");
    let denial = denial.expect("the rest are denied");
    assert!(
        denial.contains("[team/quota]")
            && denial.contains("team burst uses 8 of 8 nvidia.com/gpu in namespaces burst; this pod asks 1"),
        "{denial}"
    );
    // A retry of an admitted request (same uid) is admitted again, and charges nothing more.
    let (mut sender, _) = (senders[0].0.clone(), ());
    for i in 0..200 {
        let request = Request::post(format!("https://{authority}/validate"))
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(review(i))))
            .unwrap();
        sender.ready().await.unwrap();
        let bytes = sender.send_request(request).await.unwrap().into_body().collect().await.unwrap().to_bytes();
        let review: Value = serde_json::from_slice(&bytes).unwrap();
        if review["response"]["allowed"] == true {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 16, "the same 8 uids are admitted again on retry, no others");
}

/// Reads from `tls` until the server closes the connection (EOF or error); `None` if it is
/// still open after `within`.
async fn closed_within(tls: &mut TlsStream<TcpStream>, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let closed = tokio::time::timeout(within, async {
        let mut chunk = [0u8; 1024];
        loop {
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    closed.ok().map(|()| started.elapsed())
}

/// A slowloris client (request head sent a piece at a time, never finished) is disconnected at
/// the header-read timeout, while other clients are served.
#[tokio::test]
async fn slow_request_heads_are_cut_off_at_the_header_read_timeout() {
    allot::install_crypto_provider();
    let server = Server::start(&["--header-read-timeout-ms", "500"]);
    let mut tls = tls_connect(server.https, &server.certs().join("ca.crt"), "localhost", Alpn::H1).await;
    tls.write_all(b"POST /mutate HTTP/1.1\r\nhost: localhost\r\n").await.expect("write a partial head");
    tls.flush().await.expect("flush");
    let sent = Instant::now();
    // Keep dripping header lines, as slowloris does, well past the timeout.
    let mut drip = tls;
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        for i in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if drip.write_all(format!("x-slow-{i}: y\r\n").as_bytes()).await.is_err() || drip.flush().await.is_err() {
                return;
            }
        }
    })
    .await;
    let elapsed = sent.elapsed();
    assert!(closed.is_ok(), "a slow head kept the connection open for {elapsed:?}");
    assert!(elapsed >= Duration::from_millis(400), "closed before the timeout: {elapsed:?}");
    assert!(elapsed < Duration::from_secs(3), "the header-read timeout is 500 ms, took {elapsed:?}");

    let mut client = server.connect(Alpn::H1).await;
    assert_eq!(client.get("/healthz").await.status, StatusCode::OK);
}

/// Over `--max-connections`, a new connection is closed at once while the open ones keep
/// being served; the probes on the metrics address still answer; a freed slot is usable again.
#[tokio::test]
async fn connections_over_the_cap_are_closed_at_once_and_probes_still_answer() {
    allot::install_crypto_provider();
    let server = Server::start(&["--max-connections", "2", "--header-read-timeout-ms", "20000"]);
    let mut first = server.connect(Alpn::H1).await;
    let mut second = server.connect(Alpn::H2).await;
    assert_eq!(first.get("/healthz").await.status, StatusCode::OK);

    // The third: TCP is accepted by the kernel, then closed before (or during) the handshake.
    let tcp = TcpStream::connect(server.https).await.expect("connect");
    let name = ServerName::try_from("localhost".to_string()).expect("server name");
    let started = Instant::now();
    let handshake = tokio::time::timeout(
        Duration::from_secs(5),
        TlsConnector::from(client_config(&server.certs().join("ca.crt"), Alpn::H1)).connect(name, tcp),
    )
    .await;
    match handshake {
        Err(_) => panic!("a connection over the cap was left hanging"),
        Ok(Ok(mut tls)) => {
            // TLS 1.3 may finish the client side first; the server closes right after.
            let closed = closed_within(&mut tls, Duration::from_secs(2)).await;
            assert!(closed.is_some(), "a connection over the cap stayed open");
        }
        Ok(Err(_)) => {}
    }
    assert!(started.elapsed() < Duration::from_secs(2), "refusal took {:?}", started.elapsed());

    // Open connections are still served, and the probes (metrics address) answer.
    assert_eq!(first.get("/readyz").await.status, StatusCode::OK);
    assert_eq!(second.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(server.metrics_get("/healthz").await.status, StatusCode::OK);
    assert_eq!(server.metrics_get("/readyz").await.status, StatusCode::OK);
    let metrics = server.metrics_text().await;
    assert!(metric(&metrics, "allot_connections_refused_total", &[]).is_some_and(|v| v >= 1.0), "{metrics}");
    // The two served ones are counted by the protocol they negotiated; the refused one is not.
    let accepted = |metrics: &str, protocol: &str| {
        metric(metrics, "allot_connections_accepted_total", &[&format!("protocol=\"{protocol}\"")])
    };
    assert_eq!(accepted(&metrics, "http/1.1"), Some(1.0), "{metrics}");
    assert_eq!(accepted(&metrics, "h2"), Some(1.0), "{metrics}");
    assert_eq!(metric(&metrics, "allot_connections_open", &[]), Some(2.0), "{metrics}");

    // Closing one frees its slot.
    drop(first);
    let mut third = eventually("a freed slot is usable", Duration::from_secs(5), || async {
        let tcp = TcpStream::connect(server.https).await.map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let name = ServerName::try_from("localhost".to_string()).map_err(|e| e.to_string())?;
        let tls = TlsConnector::from(client_config(&server.certs().join("ca.crt"), Alpn::H1))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let request = Request::get("/healthz")
            .header(HOST, "localhost")
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        Ok((response.status(), sender))
    })
    .await;
    assert_eq!(third.0, StatusCode::OK);
    assert!(!third.1.is_closed());
    let _ = &mut third;
    let metrics = server.metrics_text().await;
    assert_eq!(accepted(&metrics, "http/1.1"), Some(2.0), "{metrics}");
    assert_eq!(
        metric(&metrics, "allot_connections_open", &[]),
        Some(2.0),
        "the first closed, the third open: {metrics}"
    );
}

/// A CA for client certificates and a client certificate it signed, as PEM.
struct ClientPki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn client_pki(name: &str) -> ClientPki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::from_ca_cert_pem(&ca.pem(), ca_key).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    ClientPki { ca_pem: ca.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() }
}

/// GET /healthz over a fresh TLS connection that presents `identity` (or none).
async fn healthz_as(server: &Server, identity: Option<&ClientPki>) -> Result<StatusCode, String> {
    use tokio_rustls::rustls::pki_types::PrivateKeyDer;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(server.certs().join("ca.crt")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(pki) => {
            let chain = vec![CertificateDer::from_pem_slice(pki.cert_pem.as_bytes()).unwrap()];
            let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let get = async {
        let tcp = TcpStream::connect(server.https).await.map_err(|e| e.to_string())?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let name = ServerName::try_from("localhost".to_string()).map_err(|e| e.to_string())?;
        let tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(|e| e.to_string())?;
        let (mut sender, conn) = http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let request = Request::get("/healthz")
            .header(HOST, "localhost")
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        Ok(response.status())
    };
    tokio::time::timeout(REQUEST_TIMEOUT, get).await.map_err(|_| "no answer".to_string())?
}

/// With --client-ca only clients whose certificate that CA signed are served; a new CA written
/// to the file is picked up like a rotated serving certificate.
#[tokio::test]
async fn client_ca_admits_only_clients_with_a_certificate_from_it() {
    allot::install_crypto_provider();
    let dir = shipped_dir();
    let apiserver = client_pki("apiserver");
    let stranger = client_pki("stranger");
    let ca_file = dir.path().join("certs/client-ca.crt");
    std::fs::write(&ca_file, &apiserver.ca_pem).unwrap();
    let ca_arg = ca_file.display().to_string();
    let server = Server::start_in(dir, &["--client-ca", &ca_arg]);

    assert_eq!(healthz_as(&server, Some(&apiserver)).await, Ok(StatusCode::OK));
    let anonymous = healthz_as(&server, None).await;
    assert!(anonymous.is_err(), "a client without a certificate was served: {anonymous:?}");
    let wrong = healthz_as(&server, Some(&stranger)).await;
    assert!(wrong.is_err(), "a certificate from another CA was accepted: {wrong:?}");

    // Rotation: the file now names the other CA.
    replace_file(&ca_file, &stranger.ca_pem);
    eventually("the new client CA is in force", RELOAD_DEADLINE, || async {
        match (healthz_as(&server, Some(&stranger)).await, healthz_as(&server, Some(&apiserver)).await) {
            (Ok(StatusCode::OK), Err(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Without --client-ca nothing changes: a client without a certificate is served.
#[tokio::test]
async fn without_client_ca_no_client_certificate_is_needed() {
    allot::install_crypto_provider();
    let server = Server::start(&[]);
    assert_eq!(healthz_as(&server, None).await, Ok(StatusCode::OK));
}
