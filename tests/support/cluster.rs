//! A throwaway Kubernetes control plane for end-to-end tests: etcd, kube-apiserver,
//! kube-scheduler and kube-controller-manager from the binaries named by the envtest variables
//! (`TEST_ASSET_ETCD`, `TEST_ASSET_KUBE_APISERVER`, `TEST_ASSET_KUBE_SCHEDULER`,
//! `TEST_ASSET_KUBE_CONTROLLER_MANAGER`), all on loopback, plus a real `allot serve` wired in
//! as the cluster's webhooks. No kubelet: fake GPU nodes are Node objects whose status we set,
//! so "running" means bound by the scheduler.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The binaries, or why the tests are skipped.
pub struct Assets {
    pub etcd: PathBuf,
    pub apiserver: PathBuf,
    pub scheduler: PathBuf,
    pub controller_manager: PathBuf,
}

impl Assets {
    /// Reads the envtest variables; prints a SKIPPED line naming what is missing.
    pub fn from_env(test: &str) -> Option<Assets> {
        let [etcd, apiserver, scheduler, controller_manager] = binaries_from_env(
            test,
            [
                "TEST_ASSET_ETCD",
                "TEST_ASSET_KUBE_APISERVER",
                "TEST_ASSET_KUBE_SCHEDULER",
                "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
            ],
        )?;
        Some(Assets { etcd, apiserver, scheduler, controller_manager })
    }
}

/// The binaries the envtest variables `vars` name, or `None` after a SKIPPED line naming the
/// missing ones.
pub fn binaries_from_env<const N: usize>(test: &str, vars: [&str; N]) -> Option<[PathBuf; N]> {
    let found = vars.map(|v| std::env::var_os(v).map(PathBuf::from).filter(|p| p.is_file()));
    let missing: Vec<&str> = vars.iter().zip(&found).filter(|(_, f)| f.is_none()).map(|(v, _)| *v).collect();
    if !missing.is_empty() {
        super::skipped(
            test,
            &format!("needs a real control plane; set {} to the binaries (envtest convention)", missing.join(", ")),
        );
        return None;
    }
    Some(found.map(|f| f.unwrap_or_default()))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A child process killed on drop, with its log file for diagnostics.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(name: &'static str, dir: &Path, program: &Path, args: &[String]) -> Proc {
    let log = dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log).expect("log file");
    let child = Command::new(program)
        .args(args)
        .stdout(file.try_clone().expect("log"))
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name} ({}): {e}", program.display()));
    Proc { name, child, log }
}

/// etcd and kube-apiserver on loopback (RBAC on, an admin token), ready to answer: what every
/// real-API test starts from. Processes are killed on drop.
pub struct ControlPlane {
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub client: kube::Client,
    procs: Vec<Proc>,
    /// etcd's data when it is kept in memory ([`etcd_data_dir`]); removed after the processes.
    etcd_data: Option<tempfile::TempDir>,
}

/// Where etcd keeps its data: in `/dev/shm` when that has room (2 GiB; a Docker default of 64 MiB
/// does not), else in the test's own directory. On a loaded 2-core machine etcd's fsyncs on disk
/// stalled behind cargo's writes long enough for "etcdserver: request timed out" (a 500 to a
/// create, nothing Allot did); in memory an fsync costs nothing.
fn etcd_data_dir() -> Option<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let stat = rustix::fs::statvfs(shm).ok()?;
    if stat.f_bavail.saturating_mul(stat.f_frsize) < 2 << 30 {
        return None;
    }
    tempfile::Builder::new().prefix("allot-etcd-").tempdir_in(shm).ok()
}

impl ControlPlane {
    /// The pid of the process started as `name` (`etcd`, `kube-apiserver`), for measurements
    /// from /proc.
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        self.procs.iter().find(|p| p.name == name).map(|p| p.child.id())
    }

    /// Starts both and waits (up to 90 s) for the API server's `/readyz`. The API server keeps
    /// an audit log of pod creates ([`audit_events`]).
    pub async fn start(etcd: &Path, apiserver: &Path) -> ControlPlane {
        ControlPlane::start_inner(etcd, apiserver, &[], &[], true).await
    }

    /// [`ControlPlane::start`] with extra API server flags (feature gates, runtime config).
    pub async fn start_with_apiserver_args(etcd: &Path, apiserver: &Path, args: &[String]) -> ControlPlane {
        ControlPlane::start_inner(etcd, apiserver, &[], args, true).await
    }

    /// The same, with extra etcd flags and no audit log (the scale test raises
    /// `--quota-backend-bytes`, and an audit write per create would be part of what it measures).
    pub async fn start_with(etcd: &Path, apiserver: &Path, etcd_args: &[String]) -> ControlPlane {
        ControlPlane::start_inner(etcd, apiserver, etcd_args, &[], false).await
    }

    async fn start_inner(
        etcd: &Path,
        apiserver: &Path,
        etcd_args: &[String],
        apiserver_args: &[String],
        audit: bool,
    ) -> ControlPlane {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let etcd_port = free_port();
        let peer_port = free_port();
        let api_port = free_port();
        let mut procs = Vec::new();
        let etcd_data = etcd_data_dir();
        let data_dir = etcd_data.as_ref().map_or_else(|| d.join("etcd"), |m| m.path().join("etcd"));
        let mut etcd_flags = vec![format!("--data-dir={}", data_dir.display())];
        etcd_flags.extend_from_slice(etcd_args);
        procs.push(spawn(
            "etcd",
            d,
            etcd,
            &[
                etcd_flags,
                vec![
                    format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                    format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                    format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                    format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                    format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                    "--log-level=warn".into(),
                ],
            ]
            .concat(),
        ));
        // Service-account signing key (EC P-256, PKCS#8), also the verification key.
        let sa_key = d.join("sa.key");
        let sa_pub = d.join("sa.pub");
        let key = rcgen::KeyPair::generate().expect("key");
        std::fs::write(&sa_key, key.serialize_pem()).expect("sa key");
        std::fs::write(&sa_pub, key.public_key_pem()).expect("sa public key");
        std::fs::write(d.join("tokens.csv"), format!("{TOKEN},admin,admin,system:masters\n")).expect("tokens");
        let cert_dir = d.join("apiserver-certs");
        procs.push(spawn(
            "kube-apiserver",
            d,
            apiserver,
            &[
                format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={api_port}"),
                format!("--cert-dir={}", cert_dir.display()),
                format!("--token-auth-file={}", d.join("tokens.csv").display()),
                "--authorization-mode=RBAC".into(),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={}", sa_pub.display()),
                format!("--service-account-signing-key-file={}", sa_key.display()),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                "--enable-priority-and-fairness=false".into(),
                // Loopback cannot be the `kubernetes` Service's endpoint: don't try every 10 s.
                "--endpoint-reconciler-type=none".into(),
                "--allow-privileged=true".into(),
                "--profiling=false".into(),
            ]
            .into_iter()
            .chain(apiserver_args.iter().cloned())
            .chain(
                audit
                    .then(|| {
                        // Pod creates (dry runs included) at Metadata level: the audit annotations of
                        // webhooks and ValidatingAdmissionPolicies, read by `audit_events`.
                        [
                            format!("--audit-policy-file={}", write_audit_policy(d).display()),
                            format!("--audit-log-path={}", d.join(AUDIT_LOG).display()),
                        ]
                    })
                    .into_iter()
                    .flatten(),
            )
            .collect::<Vec<_>>(),
        ));
        let kubeconfig = d.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: https://127.0.0.1:{api_port}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {TOKEN}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: admin}}\ncurrent-context: e2e\n"
            ),
        )
        .expect("kubeconfig");
        let client = client_for(&kubeconfig).await;
        let mut plane = ControlPlane { dir, kubeconfig, client, procs, etcd_data };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let ready = plane.client.request_text(axum::http::Request::get("/readyz").body(Vec::new()).unwrap()).await;
            if ready.is_ok_and(|t| t.contains("ok")) {
                return plane;
            }
            for p in &mut plane.procs {
                if let Ok(Some(status)) = p.child.try_wait() {
                    panic!("{} exited with {status} during start-up:\n{}", p.name, tail(&p.log, 30));
                }
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the API server to be ready:\n{}",
                tail(&plane.dir.path().join("kube-apiserver.log"), 30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The API server's audit log, in the control plane's directory.
const AUDIT_LOG: &str = "audit.log";

/// An audit policy that records pod creates (metadata and annotations, not bodies) and nothing
/// else.
fn write_audit_policy(dir: &Path) -> PathBuf {
    let path = dir.join("audit-policy.yaml");
    std::fs::write(
        &path,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  verbs: \
         [create]\n  resources: [{group: \"\", resources: [pods]}]\n- level: None\n",
    )
    .expect("audit policy");
    path
}

/// The audit events of pod creates so far, oldest first (the API server writes each when the
/// request completes).
pub fn audit_events(dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join(AUDIT_LOG)).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The last `n` lines of a log file.
fn tail(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(n).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// The running control plane and Allot.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub client: kube::Client,
    pub kubeconfig: PathBuf,
    procs: Vec<Proc>,
    allot: Option<Child>,
    pub allot_addr: String,
    /// The metrics address of the Allot the webhooks point at.
    pub allot_metrics: String,
    /// Extra `allot serve` flags, for every replica this cluster starts.
    allot_args: Vec<String>,
    /// etcd's in-memory data, if any (dropped after the processes are killed).
    _etcd_data: Option<tempfile::TempDir>,
}

/// A further `allot serve` replica (the webhooks do not point at it; its gang controller
/// competes for the Lease). Killed on drop.
pub struct Replica {
    child: Child,
    /// Its webhook address (`127.0.0.1:PORT`).
    pub addr: String,
    pub metrics: String,
    pub log: PathBuf,
}

impl Replica {
    /// The CPU time (user and system) the replica's process has used so far.
    pub fn cpu_time(&self) -> Duration {
        Duration::from_millis(process_ticks(self.child.id()) * 10)
    }

    /// Stops the replica with SIGTERM, as a rolling update does.
    pub fn stop(&mut self) {
        stop_child(&mut self.child);
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGTERM, then SIGKILL after 15 s.
fn stop_child(child: &mut Child) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Reads one gauge or counter (no labels) from a metrics address; `None` when unreachable.
/// `GET /readyz` on the metrics address answers 200.
/// `GET path` over plain HTTP/1.0 (Allot's metrics port): the status and the body; `None` when
/// the address does not answer (5 s read timeout).
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

pub fn ready(addr: &str) -> bool {
    http_get(addr, "/readyz").is_some_and(|(status, _)| status == 200)
}

pub fn metric(addr: &str, name: &str) -> Option<f64> {
    let (_, text) = http_get(addr, "/metrics")?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_allot();
        if std::thread::panicking() {
            for p in &self.procs {
                let text = std::fs::read_to_string(&p.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                eprintln!("--- last lines of {} ---", p.name);
                for l in tail.into_iter().rev() {
                    eprintln!("{l}");
                }
            }
            let allot = std::fs::read_to_string(self.dir.path().join("allot.log")).unwrap_or_default();
            eprintln!("--- allot.log (last 40 lines) ---");
            for l in allot.lines().rev().take(400).collect::<Vec<_>>().into_iter().rev() {
                eprintln!("{l}");
            }
        }
        // Stop in reverse order: Allot, controllers, API server, etcd.
        while let Some(p) = self.procs.pop() {
            drop(p);
        }
    }
}

const TOKEN: &str = "allot-e2e-admin-token";

/// Kubernetes' native gang scheduling, alpha in 1.36: the feature gates of every component.
pub const NATIVE_GANG_GATES: &str = "--feature-gates=GenericWorkload=true,GangScheduling=true";
/// The API native PodGroups are served under, with [`NATIVE_GANG_GATES`].
pub const NATIVE_GANG_API: &str = "--runtime-config=scheduling.k8s.io/v1alpha2=true";

/// The API server's flags for native gang scheduling.
pub fn native_gang_apiserver_args() -> Vec<String> {
    vec![NATIVE_GANG_GATES.to_string(), NATIVE_GANG_API.to_string()]
}

/// Namespaces every test cluster has.
const NAMESPACES: [&str; 5] = ["vision", "nlp", "quota-deny", "quota-queue", "quota-gang"];

impl Cluster {
    /// Starts everything and waits until the API answers and Allot's webhooks are registered.
    pub async fn start(assets: &Assets) -> Cluster {
        Cluster::start_with(assets, &[]).await
    }

    /// Starts everything with extra policy files (name, YAML) next to the shipped ones, and the
    /// namespaces they need.
    pub async fn start_with(assets: &Assets, extra_policies: &[(&str, &str)]) -> Cluster {
        Cluster::start_with_args(assets, extra_policies, &[]).await
    }

    /// [`Cluster::start_with`], passing `allot_args` to every `allot serve` it starts.
    pub async fn start_with_args(assets: &Assets, extra_policies: &[(&str, &str)], allot_args: &[&str]) -> Cluster {
        Cluster::start_with_features(assets, extra_policies, allot_args, false).await
    }

    /// [`Cluster::start_with_args`], with Kubernetes' native gang scheduling on where
    /// `native_gangs` says so ([`NATIVE_GANG_GATES`] on the API server, scheduler and
    /// controller-manager, [`NATIVE_GANG_API`] served).
    pub async fn start_with_features(
        assets: &Assets,
        extra_policies: &[(&str, &str)],
        allot_args: &[&str],
        native_gangs: bool,
    ) -> Cluster {
        let gates: Vec<String> = native_gangs.then(|| NATIVE_GANG_GATES.to_string()).into_iter().collect();
        let apiserver_args: Vec<String> = if native_gangs { native_gang_apiserver_args() } else { Vec::new() };
        let ControlPlane { dir, kubeconfig, client, procs, etcd_data } =
            ControlPlane::start_with_apiserver_args(&assets.etcd, &assets.apiserver, &apiserver_args).await;
        // From here on a failure prints the components' logs (Drop).
        for (name, text) in extra_policies {
            let policies = dir.path().join("policies");
            std::fs::create_dir_all(&policies).expect("policies dir");
            std::fs::write(policies.join(name), text).expect("extra policy");
        }
        let mut cluster = Cluster {
            dir,
            client,
            kubeconfig,
            procs,
            allot: None,
            allot_addr: String::new(),
            allot_metrics: String::new(),
            allot_args: allot_args.iter().map(|a| a.to_string()).collect(),
            _etcd_data: etcd_data,
        };
        let kc = cluster.kubeconfig.display().to_string();
        let d = cluster.dir.path().to_path_buf();
        let d = d.as_path();
        // Written by ControlPlane::start: the service-account key and the API server's certificates.
        let (sa_key, cert_dir) = (d.join("sa.key"), d.join("apiserver-certs"));
        // What the scheduler and the controller-manager share: the admin kubeconfig, no leader
        // election, no serving port (nothing here reads their health endpoints, and a port
        // picked free and bound later was seen taken in between: "bind: address already in use",
        // then no controller-manager and no ServiceAccounts).
        let component = |extra: &[String]| {
            let mut args = vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--authentication-skip-lookup=true".to_string(),
                "--leader-elect=false".to_string(),
                "--bind-address=127.0.0.1".to_string(),
                "--secure-port=0".to_string(),
            ];
            args.extend_from_slice(extra);
            args
        };
        cluster.procs.push(spawn("kube-scheduler", d, &assets.scheduler, &component(&gates)));
        cluster.procs.push(spawn(
            "kube-controller-manager",
            d,
            &assets.controller_manager,
            &component(
                &[
                    "--controllers=*,-nodelifecycle,-nodeipam,-cloud-node-lifecycle,-service,-route".into(),
                    format!("--service-account-private-key-file={}", sa_key.display()),
                    format!("--root-ca-file={}", cert_dir.join("apiserver.crt").display()),
                    "--use-service-account-credentials=false".into(),
                ]
                .into_iter()
                .chain(gates.iter().cloned())
                .collect::<Vec<_>>(),
            ),
        ));
        cluster.start_allot();
        cluster.register_webhooks().await;
        cluster.prepare().await;
        cluster
    }

    /// Starts `allot serve` (again) against this cluster.
    pub fn start_allot(&mut self) {
        let d = self.dir.path().to_path_buf();
        let allot = env!("CARGO_BIN_EXE_allot");
        let certs = d.join("allot-certs");
        if !certs.join("ca.crt").exists() {
            // (Extra policy files may already be in `policies/`; the shipped ones join them.)
            let out = Command::new(allot)
                .args(["certs", "--out", certs.to_str().unwrap(), "--dns-name", "127.0.0.1", "--dns-name", "localhost"])
                .output()
                .expect("allot certs");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let policies = d.join("policies");
            std::fs::create_dir_all(&policies).unwrap();
            for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("policies")).unwrap() {
                let entry = entry.unwrap();
                std::fs::copy(entry.path(), policies.join(entry.file_name())).unwrap();
            }
            std::fs::write(
                policies.join("gangs.yaml"),
                "apiVersion: allot.dev/v1alpha1\nkind: GangPolicy\nmetadata: {name: e2e}\nspec:\n  infer: [Job]\n  assemblyTimeout: 10m\n",
            )
            .unwrap();
        }
        let port = if self.allot_addr.is_empty() {
            "0".to_string()
        } else {
            self.allot_addr.rsplit(':').next().unwrap().to_string()
        };
        let (child, addr, metrics) = self.spawn_allot(&port, &format!("e2e-{}", std::process::id()), "allot.log");
        self.allot_addr = addr;
        self.allot_metrics = metrics;
        self.allot = Some(child);
    }

    /// Starts another replica under `identity`, logging to `allot-IDENTITY.log`.
    pub fn start_replica(&self, identity: &str) -> Replica {
        let log = format!("allot-{identity}.log");
        let (child, addr, metrics) = self.spawn_allot("0", identity, &log);
        Replica { child, addr, metrics, log: self.dir.path().join(log) }
    }

    /// Spawns `allot serve` and waits for its serving line: (child, https address, metrics address).
    fn spawn_allot(&self, port: &str, identity: &str, log: &str) -> (Child, String, String) {
        let d = self.dir.path().to_path_buf();
        let allot = env!("CARGO_BIN_EXE_allot");
        let certs = d.join("allot-certs");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(d.join(log)).unwrap();
        let mut child = Command::new(allot)
            .args([
                "serve",
                "--policies",
                d.join("policies").to_str().unwrap(),
                "--tls-cert",
                certs.join("tls.crt").to_str().unwrap(),
                "--tls-key",
                certs.join("tls.key").to_str().unwrap(),
                "--addr",
                &format!("127.0.0.1:{port}"),
                "--metrics-addr",
                "127.0.0.1:0",
                "--lease-namespace",
                "default",
                "--identity",
                identity,
                "--resync-secs",
                "5",
                // No --allot-username: Allot asks the API server who it is (the admin token
                // here), and that identity alone may lift its gates. (Tenants are impersonated.)
            ])
            .args(&self.allot_args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", std::env::var("ALLOT_E2E_LOG").unwrap_or_else(|_| "info,kube=warn".into()))
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("allot serve");
        let stdout = child.stdout.take().unwrap();
        // A start that fails (no serving line, never ready) panics below: the guard kills the
        // process then, so no `allot serve` outlives the test.
        let child = super::KilledOnDrop::new(child);
        let line = super::first_line(stdout, Duration::from_secs(30)).expect("allot serve did not start");
        let (addr, metrics) = super::serving_addresses(&line).expect("address line");
        // As a rollout does: wait for /readyz (the watches have synced; before that, quota
        // checks fail closed with "Allot is starting").
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !ready(&metrics) {
            assert!(std::time::Instant::now() < deadline, "allot serve at {metrics} not ready within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        (child.into_inner(), addr, metrics)
    }

    /// Kills `allot serve` with SIGKILL (a crash: no Lease handover, requests cut off).
    pub fn kill_allot(&mut self) {
        if let Some(mut child) = self.allot.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops `allot serve` (a controller restart, or the end of the test).
    pub fn stop_allot(&mut self) {
        if let Some(mut child) = self.allot.take() {
            stop_child(&mut child);
        }
    }

    async fn register_webhooks(&self) {
        let ca = self.dir.path().join("allot-certs/ca.crt");
        let out = Command::new(env!("CARGO_BIN_EXE_allot"))
            .args(["webhooks", "--ca-bundle", ca.to_str().unwrap(), "--url", &format!("https://{}", self.allot_addr)])
            .output()
            .expect("allot webhooks");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).unwrap();
        let m: MutatingWebhookConfiguration = serde_json::from_value(docs[0].clone()).unwrap();
        let v: ValidatingWebhookConfiguration = serde_json::from_value(docs[1].clone()).unwrap();
        Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .create(&PostParams::default(), &m)
            .await
            .expect("mutating webhook");
        Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .create(&PostParams::default(), &v)
            .await
            .expect("validating webhook");
    }

    /// Namespaces, PriorityClasses the shipped policies use, and two GPU nodes of 2 GPUs.
    async fn prepare(&self) {
        let pcs: Api<PriorityClass> = Api::all(self.client.clone());
        for (name, value, global) in [("low-priority", 0, true), ("high-priority", 1_000_000, false)] {
            let pc: PriorityClass =
                serde_json::from_value(json!({"metadata": {"name": name}, "value": value, "globalDefault": global}))
                    .unwrap();
            pcs.create(&PostParams::default(), &pc).await.expect("priority class");
        }
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        for ns in NAMESPACES {
            namespaces
                .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
                .await
                .expect("namespace");
        }
        for name in ["gpu-node-1", "gpu-node-2"] {
            self.add_gpu_node(name, 2).await;
        }
        // Pods need their namespace's default ServiceAccount (made by the controller-manager).
        for ns in NAMESPACES {
            let sas: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
            wait_for("the default service account", Duration::from_secs(60), || async {
                sas.get_opt("default").await.ok().flatten().is_some()
            })
            .await;
        }
    }

    /// A fake GPU node: tainted for GPU pods only, `gpus` allocatable, Ready.
    pub async fn add_gpu_node(&self, name: &str, gpus: u32) {
        add_gpu_node(&self.client, name, gpus).await;
    }
}

/// A fake GPU node (labelled `node-type: my-precious`, as the shipped Placement selects):
/// tainted for GPU pods only, `gpus` allocatable, Ready.
pub async fn add_gpu_node(client: &kube::Client, name: &str, gpus: u32) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "node-type": "my-precious"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.expect("node");
    let resources = json!({"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()});
    let status = json!({"status": {"capacity": resources, "allocatable": resources, "conditions": [
        {"type": "Ready", "status": "True", "reason": "E2E", "message": "fake node", "lastHeartbeatTime": now(), "lastTransitionTime": now()}
    ]}});
    nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(status)).await.expect("node status");
    // The API server taints new nodes not-ready; with no kubelet nothing lifts it.
    let taints = json!({"spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}});
    nodes.patch(name, &PatchParams::default(), &Patch::Merge(taints)).await.expect("node taints");
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

async fn client_for(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.expect("config");
    kube::Client::try_from(config).expect("client")
}

/// Polls `check` until it holds or `timeout` passes (then panics with `what`).
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// JSON Patch operations that move each webhook's URL from host `from` to host `to`.
fn moved(urls: impl Iterator<Item = Option<String>>, from: &str, to: &str) -> Vec<serde_json::Value> {
    urls.enumerate()
        .map(|(i, url)| {
            let url = url.expect("a URL webhook").replace(from, to);
            json!({"op": "replace", "path": format!("/webhooks/{i}/clientConfig/url"), "value": url})
        })
        .collect()
}

/// Points both webhook configurations' URLs (as `allot webhooks` registered them) at host `to` instead of `from` (paths kept).
pub async fn point_webhooks_at(client: &kube::Client, from: &str, to: &str) {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    for m in mutating.list(&ListParams::default()).await.unwrap().items {
        let ops = moved(m.webhooks.iter().flatten().map(|w| w.client_config.url.clone()), from, to);
        let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
        mutating
            .patch(m.metadata.name.as_deref().unwrap(), &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .unwrap();
    }
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    for v in validating.list(&ListParams::default()).await.unwrap().items {
        let ops = moved(v.webhooks.iter().flatten().map(|w| w.client_config.url.clone()), from, to);
        let patch: json_patch::Patch = serde_json::from_value(json!(ops)).unwrap();
        validating
            .patch(v.metadata.name.as_deref().unwrap(), &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .unwrap();
    }
}

/// Serves each custom kind `(group, version, kind)` with an open schema, as its operator's CRD
/// would (named by Allot's plural, the one its native policies bind; one already served is left
/// as it is), and waits until every one is established.
pub async fn serve_custom_kinds(client: &kube::Client, kinds: &std::collections::BTreeSet<(String, String, String)>) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let mut by_kind: std::collections::BTreeMap<(&str, &str), Vec<&str>> = std::collections::BTreeMap::new();
    for (group, version, kind) in kinds {
        by_kind.entry((group, kind)).or_default().push(version);
    }
    let mut names = Vec::new();
    for ((group, kind), versions) in &by_kind {
        let plural = format!("{}s", kind.to_lowercase());
        let name = format!("{plural}.{group}");
        let versions: Vec<_> = versions
            .iter()
            .enumerate()
            .map(|(i, v)| {
                json!({"name": v, "served": true, "storage": i == 0,
                       "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
            })
            .collect();
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"group": group, "scope": "Namespaced", "versions": versions,
                     "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind, "listKind": format!("{kind}List")}}
        }))
        .expect("crd");
        if api.get_opt(&name).await.expect("get the CRD").is_none() {
            api.create(&PostParams::default(), &crd).await.expect("create the CRD");
        }
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for name in &names {
        loop {
            let crd = api.get(name).await.expect("get the CRD");
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            assert!(Instant::now() < deadline, "CRD {name} not established within 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The `allot.dev/GangReady` condition of `pod`: (status, reason, message).
pub fn gang_condition(pod: &k8s_openapi::api::core::v1::Pod) -> Option<(String, String, String)> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "allot.dev/GangReady")?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}

/// A one-GPU member of the explicit gang `gang` of `size` (label and annotation).
pub fn gang_member(name: &str, gang: &str, size: u32) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"allot.dev/gang-name": gang}, "annotations": {"allot.dev/gang-size": size.to_string()}},
        "spec": {"containers": [{"name": "worker", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .expect("a gang member")
}

/// The pod still carries Allot's gang gate.
pub fn gang_gated(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == "allot.dev/gang"))
}

/// Gives `user` the Role `name` with `rules` in namespace `ns` (server-side applied, so calling
/// it again changes nothing): how the tests make a tenant, a namespaced Role and nothing else.
pub async fn grant_role(admin: &kube::Client, ns: &str, name: &str, user: &str, rules: serde_json::Value) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let role: Role = serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).expect("role");
    let binding: RoleBinding = serde_json::from_value(json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
    .expect("role binding");
    let apply = PatchParams::apply("allot-tests").force();
    Api::<Role>::namespaced(admin.clone(), ns).patch(name, &apply, &Patch::Apply(&role)).await.expect("role");
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .patch(name, &apply, &Patch::Apply(&binding))
        .await
        .expect("role binding");
}

/// A client of the admin's kubeconfig at `kubeconfig` impersonating `user` (`kubectl --as=USER`).
pub async fn impersonating(kubeconfig: &Path, user: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.expect("config");
    config.auth_info.impersonate = Some(user.into());
    kube::Client::try_from(config).expect("impersonating client")
}

/// A tenant's namespace: created if missing, `user` given the Role `tenant` with `rules`
/// ([`grant_role`]), and the default ServiceAccount pods need (made by the controller-manager).
pub async fn tenant_namespace(admin: &kube::Client, ns: &str, user: &str, rules: serde_json::Value) {
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    if namespaces.get_opt(ns).await.expect("get namespace").is_none() {
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
        namespaces.create(&PostParams::default(), &namespace).await.expect("namespace");
    }
    grant_role(admin, ns, "tenant", user, rules.clone()).await;
    wait_until_allowed(admin, ns, user, &rules).await;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    wait_for("the default service account", Duration::from_secs(60), || async {
        sas.get_opt("default").await.ok().flatten().is_some()
    })
    .await;
}

/// Waits until the API server's authorizer lets `user` do the first verb of each of `rules` on
/// its first resource in `ns`: a RoleBinding just made reaches the authorizer's cache a moment
/// later (a full CI run once saw a tenant's first create refused with 403).
pub async fn wait_until_allowed(admin: &kube::Client, ns: &str, user: &str, rules: &serde_json::Value) {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    for rule in rules.as_array().into_iter().flatten() {
        let first = |key: &str| rule[key].get(0).and_then(|v| v.as_str()).unwrap_or_default().to_string();
        let (group, resource, verb) = (first("apiGroups"), first("resources"), first("verbs"));
        let (resource, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r.to_string(), s.to_string()),
            None => (resource, String::new()),
        };
        let review: SubjectAccessReview = serde_json::from_value(json!({"spec": {"user": user,
            "resourceAttributes": {"namespace": ns, "group": group, "resource": resource,
                "subresource": subresource, "verb": if verb == "*" { "create" } else { verb.as_str() }}}}))
        .expect("a review");
        wait_for(&format!("{user} allowed on {resource} in {ns}"), Duration::from_secs(30), || async {
            let answer = reviews.create(&PostParams::default(), &review).await;
            answer.ok().and_then(|r| r.status).is_some_and(|s| s.allowed)
        })
        .await;
    }
}

/// User + system CPU ticks of process `pid` (0 if it is gone), in Linux's USER_HZ (100 a second).
pub fn process_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}
