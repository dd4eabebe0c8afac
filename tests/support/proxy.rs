//! A round-robin HTTPS proxy in front of several `allot serve` replicas, as a Service spreads
//! in-cluster webhook calls over its endpoints. It terminates TLS offering only HTTP/1.1 (ALPN
//! `http/1.1`, what the API server uses for `service:` webhooks; offered HTTP/2, the API server
//! would multiplex every review on one connection) and picks the next replica per request, over
//! a new connection each time. A replica that refuses the connection (killed) is skipped, as an
//! endpoint that fails its readiness probe is; a request cut off mid-way fails (502).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::{Body, Bytes};
use axum::http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

pub struct Proxy {
    pub addr: SocketAddr,
    /// Requests forwarded to each backend, in the order given.
    pub forwarded: Arc<Vec<AtomicUsize>>,
    handle: axum_server::Handle<SocketAddr>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

struct Backends {
    addrs: Vec<String>,
    next: AtomicUsize,
    forwarded: Arc<Vec<AtomicUsize>>,
    tls: tokio_rustls::TlsConnector,
}

impl Proxy {
    /// Serves with `cert`/`key` on loopback, forwarding to `backends` (`127.0.0.1:PORT`), whose
    /// certificates `ca` signs.
    pub async fn start(cert: &Path, key: &Path, ca: &Path, backends: Vec<String>) -> Proxy {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(cert).expect("proxy cert").map(|c| c.expect("cert")).collect();
        let key = PrivateKeyDer::from_pem_file(key).expect("proxy key");
        let mut server = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(certs, key).unwrap();
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca).expect("ca") {
            roots.add(c.expect("ca cert")).unwrap();
        }
        let mut client = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        let forwarded = Arc::new(backends.iter().map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        let backends = Arc::new(Backends {
            addrs: backends,
            next: AtomicUsize::new(0),
            forwarded: forwarded.clone(),
            tls: tokio_rustls::TlsConnector::from(Arc::new(client)),
        });
        let app = axum::Router::new().fallback(move |req: Request<Body>| {
            let backends = backends.clone();
            async move { forward(&backends, req).await }
        });
        let handle = axum_server::Handle::new();
        let config = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(server));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let server = axum_server::from_tcp_rustls(listener, config).unwrap().handle(handle.clone());
        tokio::spawn(server.serve(app.into_make_service()));
        Proxy { addr, forwarded, handle }
    }
}

async fn forward(backends: &Backends, req: Request<Body>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return error(StatusCode::BAD_REQUEST, "proxy: could not read the request body");
    };
    let n = backends.addrs.len();
    let first = backends.next.fetch_add(1, Ordering::Relaxed);
    for i in 0..n {
        let index = (first + i) % n;
        let addr = &backends.addrs[index];
        let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else { continue };
        let _ = tcp.set_nodelay(true);
        let Ok(tls) = backends.tls.connect(ServerName::try_from("127.0.0.1").unwrap(), tcp).await else { continue };
        backends.forwarded[index].fetch_add(1, Ordering::Relaxed);
        return match send(tls, addr, &parts, body.clone()).await {
            Ok(r) => r,
            Err(e) => error(StatusCode::BAD_GATEWAY, &format!("proxy: {addr}: {e}")),
        };
    }
    error(StatusCode::BAD_GATEWAY, "proxy: no backend accepts connections")
}

async fn send(
    tls: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    addr: &str,
    parts: &axum::http::request::Parts,
    body: Bytes,
) -> Result<Response<Body>, String> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let mut request = Request::builder().method(parts.method.clone()).uri(parts.uri.path().to_string());
    for (k, v) in parts.headers.iter().filter(|(k, _)| *k != "host") {
        request = request.header(k, v);
    }
    let request = request.header("host", addr).body(Full::new(body)).map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Response::from_parts(parts, Body::from(body)))
}

fn error(code: StatusCode, message: &str) -> Response<Body> {
    Response::builder().status(code).body(Body::from(message.to_string())).unwrap()
}
