//! Allot at cluster scale (issue 18), on a real kube-apiserver + etcd (skipped without the
//! envtest binaries): `allot serve` registered as both webhooks, one Team owning 20 namespaces
//! with a large deny quota, N one-GPU pods created through it by concurrent clients, then bound
//! to 5,000 node names through the `binding` subresource, as the scheduler binds them (no
//! kubelet runs, so they stay Pending, but Allot holds them as running on their nodes, as on a
//! full cluster: the nodes' loads and the running pods a preemption reads). Prints what Allot's memory does — RSS empty, grown at N, and
//! after a restart at N (peak while its caches fill, settled, time to settle, /readyz not ready
//! before the cache holds every pod) — and pod creates/s with Allot as a ratio to no webhook,
//! at 0 and at N pods, alternated in the same run.
//!
//! CI runs it at a small N (`ALLOT_SCALE_PODS`, default 300). `scripts/scale.sh` runs it at
//! 100,000 against a release build of `allot` (`ALLOT_SCALE_BIN`). The assertions are what must
//! hold at any N: every create succeeds, Allot tracks every pod, /readyz waits for the fill, the
//! restart settles; the figures themselves are printed, not asserted (the machine is shared).
//!
//! With the `baseline-server` example (`ALLOT_SCALE_BASELINE_BIN`, else the one `cargo test
//! --all-targets` builds; the comparison prints SKIPPED without one), it also compares creates/s
//! with Allot against the same with that trivial webhook registered in Allot's place (issue 13),
//! alternated `rounds` times before the fill, and against a second baseline that answers every
//! /mutate with Allot's own patch for these pods (checked on the pods it admitted;
//! `ALLOT_SCALE_BASELINE_PATCH` sets another, `none` leaves it out): what the API server spends
//! applying a mutation, which any placing webhook costs it, apart from Allot's own cost. It
//! prints the CPU time each process (API server, etcd, Allot, the baselines, the test's clients,
//! the whole machine) spent per create under each webhook.
//! `ALLOT_SCALE_NO_QUOTA=1` gives the scale team no quota (no deny-mode ledger write per create).
//!
//! Last, on the restarted Allot, the waiting-gangs phase (issue 49, `scale/gangs.rs`):
//! `ALLOT_SCALE_GANGS` incomplete gangs (default 20) behind the gate, Allot's CPU over
//! `ALLOT_SCALE_IDLE_SECS` (default 30) with nothing happening, and the time of a /metrics scrape;
//! then Allot restarted once more with the gangs waiting: its settled RSS against the restart
//! without them, per gang.

mod support;

// The parts, one job each, in tests/scale/ (a directory without a main.rs: no test target of
// its own).
#[path = "scale/allot.rs"]
mod allot_process;
#[path = "scale/baseline.rs"]
mod baseline;
#[path = "scale/bind.rs"]
mod bind;
#[path = "scale/gangs.rs"]
mod gangs;
#[path = "scale/transport.rs"]
mod transport;
#[path = "scale/webhooks.rs"]
mod webhooks;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use allot_process::{Allot, mib, paged_list_secs, restart, restart_each, threads_of, wait_tracked};
use baseline::{
    ALLOT_PATCH, Baseline, Contender, Tally, Watched, baseline_ratio, comparison_report, patch_values_present,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::cluster::{ControlPlane, binaries_from_env, metric, ready};
use transport::Transport;
use webhooks::{create_ratio, probe, webhook_configs};

/// Namespaces the scale team owns.
const NAMESPACES: usize = 20;
/// The node names the pods are bound to (Kubernetes' tested 5,000 nodes; no Node objects).
pub(crate) const NODE_NAMES: usize = 5_000;
/// A namespace of no team: a GPU pod there is denied by Allot, admitted without it (the probe
/// that tells when the API server has picked up a webhook change).
const PROBE_NAMESPACE: &str = "scale-probe";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default)
}

/// What the run is asked to do (environment, with CI-sized defaults).
struct Settings {
    pods: usize,
    clients: usize,
    /// Pods per timed batch of the creates/s comparison.
    batch: usize,
    /// Alternations (with, without) per comparison point.
    rounds: usize,
    /// How long to watch RSS after a restart.
    observe: Duration,
    allot: PathBuf,
    /// The `baseline-server` example: `ALLOT_SCALE_BASELINE_BIN`, else the one cargo built
    /// beside this test's `allot` (`cargo test --all-targets` builds examples), if any.
    baseline: Option<PathBuf>,
    /// Incomplete gangs of the waiting-gangs phase, of `gang_size` declared members each.
    gangs: usize,
    gang_size: usize,
    /// How long that phase watches Allot's CPU with nothing happening.
    idle: Duration,
}

impl Settings {
    fn from_env() -> Settings {
        let pods = env_usize("ALLOT_SCALE_PODS", 300);
        Settings {
            pods,
            clients: env_usize("ALLOT_SCALE_CLIENTS", 32),
            batch: env_usize("ALLOT_SCALE_BATCH", (pods / 50).clamp(50, 1500)),
            rounds: env_usize("ALLOT_SCALE_ROUNDS", 2),
            observe: Duration::from_secs(env_usize("ALLOT_SCALE_OBSERVE_SECS", 8) as u64),
            allot: std::env::var_os("ALLOT_SCALE_BIN")
                .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_allot")), PathBuf::from),
            baseline: std::env::var_os("ALLOT_SCALE_BASELINE_BIN").map(PathBuf::from).or_else(|| {
                let built = Path::new(env!("CARGO_BIN_EXE_allot")).with_file_name("examples").join("baseline-server");
                built.is_file().then_some(built)
            }),
            gangs: env_usize("ALLOT_SCALE_GANGS", 20),
            gang_size: env_usize("ALLOT_SCALE_GANG_SIZE", 4).max(2),
            idle: Duration::from_secs(env_usize("ALLOT_SCALE_IDLE_SECS", 30) as u64),
        }
    }
}

/// Creates pods `from..from + count` (one GPU each, spread over the team's namespaces) with
/// `clients` requests in flight; returns the seconds taken and the failures.
/// Creates refused by the deny-mode ledger's fail-closed answer ("retry when the API server
/// answers") and created again, over the whole run: a client such as the Job controller retries
/// them the same way. Reported with the fill; a create refused for any other reason fails the run.
static RETRIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many times one create is tried when the ledger fails closed.
const ATTEMPTS: u32 = 5;

async fn create_pods(client: &kube::Client, from: usize, count: usize, clients: usize) -> (f64, Vec<String>) {
    let started = Instant::now();
    let failures: Vec<String> = futures::stream::iter(from..from + count)
        .map(|i| {
            let client = client.clone();
            async move {
                let ns = format!("scale-{:02}", i % NAMESPACES);
                let body = json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("p-{i}")},
                    "spec": {"containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
                });
                for attempt in 1..=ATTEMPTS {
                    let error = post_json(&client, &format!("/api/v1/namespaces/{ns}/pods"), &body).await;
                    match error.map(|e| format!("{ns}/p-{i}: {e}")) {
                        Some(e) if e.contains("deny-mode quota fails closed") && attempt < ATTEMPTS => {
                            RETRIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
                        }
                        other => return other,
                    }
                }
                None
            }
        })
        .buffer_unordered(clients)
        .filter_map(|r| async move { r })
        .collect()
        .await;
    (started.elapsed().as_secs_f64(), failures)
}

/// POSTs `body` as JSON to the API server's `path`: `None` when it is accepted, else the error.
pub(crate) async fn post_json(client: &kube::Client, path: &str, body: &serde_json::Value) -> Option<String> {
    let request = axum::http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap_or_default());
    match request {
        Ok(r) => client.request_text(r).await.err().map(|e| e.to_string()),
        Err(e) => Some(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allot_at_scale() {
    allot::install_crypto_provider();
    let Some([etcd, apiserver]) = binaries_from_env("allot_at_scale", ["TEST_ASSET_ETCD", "TEST_ASSET_KUBE_APISERVER"])
    else {
        return;
    };
    let settings = Settings::from_env();
    let plane = ControlPlane::start_with(&etcd, &apiserver, &["--quota-backend-bytes=8589934592".to_string()]).await;
    let client = plane.client.clone();
    let dir = plane.dir.path().to_path_buf();

    // Policies: the shipped ones plus a team owning the 20 namespaces with a quota no one reaches.
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).expect("policies dir");
    for entry in std::fs::read_dir(support::root().join("policies")).expect("policies") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), policies.join(entry.file_name())).expect("copy policy");
    }
    // ALLOT_SCALE_NO_QUOTA=1 leaves the quota out (no ledger commit per create). With it, every
    // create commits its charge to the team's shared ledger (the leader folds seen pods into
    // per-namespace totals, so the ledger's size does not grow with the pods).
    let quota = if std::env::var("ALLOT_SCALE_NO_QUOTA").is_ok_and(|v| v == "1") {
        ""
    } else {
        "  quota: {mode: Deny, limits: {nvidia.com/gpu: 10000000}}\n"
    };
    std::fs::write(
        policies.join("scale-team.yaml"),
        format!(
            "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {{name: scale}}\nspec:\n  namespaces: {{names: ['scale-[0-9]*']}}\n  priority: {{default: low-priority, allowed: [low-priority]}}\n{quota}"
        ),
    )
    .expect("team policy");
    let transport = Transport::choose();
    let certs = dir.join("allot-certs");
    let out = Command::new(&settings.allot)
        .args(["certs", "--out"])
        .arg(&certs)
        .args(["--dns-name", "127.0.0.1", "--dns-name", "localhost", "--dns-name", &transport.host])
        .output()
        .expect("allot certs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Namespaces with their default ServiceAccount (no controller-manager runs), priority classes.
    let pcs: Api<PriorityClass> = Api::all(client.clone());
    for (name, value) in [("low-priority", 0), ("high-priority", 1_000_000)] {
        let pc: PriorityClass =
            serde_json::from_value(json!({"metadata": {"name": name}, "value": value})).expect("pc");
        pcs.create(&PostParams::default(), &pc).await.expect("priority class");
    }
    let names: Vec<String> =
        (0..NAMESPACES).map(|i| format!("scale-{i:02}")).chain([PROBE_NAMESPACE.to_string()]).collect();
    for ns in &names {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces
            .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("ns"))
            .await
            .expect("namespace");
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        sas.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("sa"),
        )
        .await
        .expect("service account");
    }

    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let mut allot = Allot::spawn(&settings.allot, &dir, &plane.kubeconfig, port);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready(&allot.metrics) {
        assert!(Instant::now() < deadline, "allot not ready within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (rss_empty, _, anon_empty) = allot.memory_with_anon();
    // Its thread count, sampled from here to the end of the fill.
    let threads_idle = allot.threads();
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (pid, sampling) = (allot.child.id(), sampling.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while sampling.load(Ordering::Relaxed) {
                most = most.max(threads_of(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            most
        })
    };
    let configs = webhook_configs(&settings.allot, &certs.join("ca.crt"), &transport.url(port));

    let mut next = 0;
    let (ratio_0, with_0, without_0) = create_ratio(&client, &configs, &settings, &mut next).await;

    // Allot against the trivial webhook in its place (issue 13), when a baseline-server is given.
    if settings.baseline.is_none() {
        support::skipped(
            "allot_at_scale (the comparison with the trivial webhook)",
            "no baseline-server: set ALLOT_SCALE_BASELINE_BIN or build it (cargo build --example baseline-server)",
        );
    }
    let against_baseline = match &settings.baseline {
        Some(bin) => {
            let baseline = Baseline::spawn(Path::new(&bin), &dir, None);
            let patch = match std::env::var("ALLOT_SCALE_BASELINE_PATCH") {
                Ok(p) if p == "none" => None,
                Ok(p) => Some(p),
                Err(_) => Some(ALLOT_PATCH.to_string()),
            };
            let patching = patch.as_deref().map(|p| Baseline::spawn(Path::new(&bin), &dir, Some(p)));
            let configs_of =
                |url: &str| webhook_configs(&settings.allot, &certs.join("ca.crt"), &transport.same_host(url));
            let mut contenders = vec![
                Contender { label: "Allot", configs: configs.clone(), is_allot: true, patches: true },
                Contender {
                    label: "the trivial webhook",
                    configs: configs_of(&baseline.url),
                    is_allot: false,
                    patches: false,
                },
            ];
            let mut processes = vec![
                ("kube-apiserver", plane.pid_of("kube-apiserver").unwrap_or(0)),
                ("etcd", plane.pid_of("etcd").unwrap_or(0)),
                ("allot", allot.child.id()),
                ("baseline", baseline.child.id()),
            ];
            if let Some(patching) = &patching {
                contenders.push(Contender {
                    label: "the same, patching",
                    configs: configs_of(&patching.url),
                    is_allot: false,
                    patches: true,
                });
                processes.push(("baseline+patch", patching.child.id()));
            }
            processes.push(("test clients", std::process::id()));
            let watched = Watched { processes };
            let tallies = baseline_ratio(&client, &contenders, &settings, &mut next, &watched).await;
            if let Some(patch) = &patch {
                // The patching baseline does to the pods what Allot does, and the trivial one
                // nothing: the comparison isolates each webhook's own cost.
                let pod_of = |tally: &Tally| {
                    let i = tally.first_pod.expect("every contender answered a batch");
                    (format!("scale-{:02}", i % NAMESPACES), format!("p-{i}"))
                };
                for (contender, tally) in contenders.iter().zip(&tallies) {
                    let carries = contender.patches;
                    let (ns, name) = pod_of(tally);
                    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns)
                        .get(&name)
                        .await
                        .unwrap_or_else(|e| panic!("{ns}/{name}: {e}"));
                    let pod = serde_json::to_value(pod).expect("pod as JSON");
                    assert_eq!(
                        patch_values_present(patch, &pod),
                        carries,
                        "{ns}/{name} carries the patch's values: expected {carries} (ALLOT_SCALE_BASELINE_PATCH \
                         must be Allot's patch for these pods)"
                    );
                }
            }
            let ratio = tallies[0].rate() / tallies[1].rate().max(1e-9);
            Some((ratio, comparison_report(&contenders, &tallies, &watched, &settings)))
        }
        None => None,
    };

    // What the API server spoke to Allot so far (the counters restart with Allot, below).
    // `None` from a build without the counter (ALLOT_SCALE_BIN older than it): nothing asserted.
    let connections = |protocol: &str| {
        metric(&allot.metrics, &format!("allot_connections_accepted_total{{protocol=\"{protocol}\"}}"))
    };
    let (over_http1, over_h2) = (connections("http/1.1"), connections("h2"));
    let counted = metric(&allot.metrics, "allot_connections_open").is_some();
    let (over_http1, over_h2) = (over_http1.unwrap_or(0.0), over_h2.unwrap_or(0.0));

    // The fill: N pods through Allot.
    let (secs, failures) = create_pods(&client, next, settings.pods, settings.clients).await;
    sampling.store(false, Ordering::Relaxed);
    let threads_busy = sampler.join().expect("thread sampler");
    assert!(failures.is_empty(), "{} of {} creates failed, first: {}", failures.len(), settings.pods, failures[0]);
    next += settings.pods;
    let fill_rate = settings.pods as f64 / secs;
    wait_tracked(&allot, next, Duration::from_secs(120)).await;
    let filled_pods = next;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_full = allot.rss();

    let (ratio_n, with_n, without_n) = create_ratio(&client, &configs, &settings, &mut next).await;
    wait_tracked(&allot, next, Duration::from_secs(120)).await;
    // Every pod bound to a node, as the scheduler would (after the creates/s comparison, which
    // times creates alone), and Allot seeing each bound.
    let bind_secs = bind::bind_pods(&client, next, settings.clients).await;
    bind::wait_bound(&allot, next, Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_grown, _, anon_grown) = allot.memory_with_anon();
    let grown_pods = next;

    // Other builds (another allocator, the code before a change) restarted on the same cluster,
    // for a same-run comparison.
    let builds = allot_process::builds_to_compare();
    let (after, compared) = restart_each(allot, &builds, &settings, &dir, &plane.kubeconfig, port, next).await;
    allot = after;
    let (list_secs, list_pages) = paged_list_secs(&client, false).await;
    let (cached_list_secs, cached_list_pages) = paged_list_secs(&client, true).await;
    let (allot_after, restart) = restart(allot, &settings.allot, &settings, &dir, &plane.kubeconfig, port, next).await;
    allot = allot_after;
    let tracked_after = allot.tracked_pods();
    let denied_probe_after = {
        // Allot still answers after the restart (a team-less GPU pod is denied).
        Api::namespaced(client.clone(), PROBE_NAMESPACE)
            .create(&PostParams::default(), &probe("probe-after"))
            .await
            .is_err()
    };
    println!(
        "== allot at scale: {grown_pods} pods ({} filled through Allot at {fill_rate:.0}/s, {} clients; \
         {} creates the deny-mode ledger refused failing closed, retried, so far; all bound to \
         {} node names in {bind_secs:.1} s)",
        settings.pods,
        settings.clients,
        RETRIED.load(Ordering::Relaxed),
        NODE_NAMES.min(grown_pods)
    );
    println!("allot binary: {}", settings.allot.display());
    println!(
        "transport: webhooks at {} ({}): the API server opened {over_http1} HTTP/1.1 and {over_h2} HTTP/2 \
         connections to Allot before the fill",
        transport.url(port),
        transport.why
    );
    println!("RSS empty:                          {:8.1} MiB  (anonymous {:.1} MiB)", mib(rss_empty), mib(anon_empty));
    println!("threads: idle {threads_idle}, most during the fill {threads_busy}");
    println!("RSS after the fill ({:>7} pods):   {:8.1} MiB", filled_pods, mib(rss_full));
    println!(
        "RSS grown ({grown_pods:>7} pods):            {:8.1} MiB  ({:.0} bytes/pod over empty; anonymous {:.1} MiB)",
        mib(rss_grown),
        (rss_grown.saturating_sub(rss_empty)) as f64 / grown_pods as f64,
        mib(anon_grown)
    );
    println!(
        "restart: ready after                {:8.2} s (ready while under-filled: {} samples)",
        restart.ready_after, restart.ready_too_early
    );
    println!(
        "the API server's paged LIST alone:  {list_secs:8.2} s ({list_pages} pages of 500, just before the restart; ready ÷ list {:.2}; from its watch cache: {cached_list_secs:.2} s, {cached_list_pages} pages)",
        restart.ready_after / list_secs
    );
    println!("restart: peak RSS (VmHWM)           {:8.1} MiB", mib(restart.peak));
    println!(
        "restart: settled RSS                {:8.1} MiB after {:.2} s (peak/settled {:.2})",
        mib(restart.settled),
        restart.settled_after,
        restart.peak as f64 / restart.settled.max(1) as f64
    );
    for ((label, _), r) in builds.iter().zip(&compared) {
        println!("restart of {label}: {}", r.summary());
    }
    println!("creates/s at 0 pods:  with Allot {with_0:7.1}, without {without_0:7.1}, ratio {ratio_0:.3}");
    println!("creates/s at N pods:  with Allot {with_n:7.1}, without {without_n:7.1}, ratio {ratio_n:.3}");
    println!("ratio at N / ratio at 0: {:.3}", ratio_n / ratio_0);
    if let Some((ratio, lines)) = &against_baseline {
        for line in lines {
            println!("{line}");
        }
        assert!(*ratio > 0.0);
    }
    // Incomplete gangs behind the gate, on the restarted Allot, after every figure above.
    let waiting = gangs::waiting_gangs(&client, &allot, &settings).await;
    for line in waiting.report(&settings, grown_pods) {
        println!("{line}");
    }
    // What the gangs cost at rest: Allot restarted again with them waiting, against the restart
    // without them (same cluster, same build).
    let with_gangs = next + waiting.members();
    // The other builds first, with the gangs waiting too: this build's restart comes last.
    let (after, compared) = restart_each(allot, &builds, &settings, &dir, &plane.kubeconfig, port, with_gangs).await;
    allot = after;
    for ((label, _), r) in builds.iter().zip(&compared) {
        println!("restart of {label} with the gangs: {}", r.summary());
    }
    let (allot_gangs, gangs_restart) =
        allot_process::restart(allot, &settings.allot, &settings, &dir, &plane.kubeconfig, port, with_gangs).await;
    allot = allot_gangs;
    for line in gangs::at_rest(&waiting, &restart, &gangs_restart, (rss_grown.saturating_sub(rss_empty), grown_pods)) {
        println!("{line}");
    }
    // Whether the restarted leader told the waiting gangs again (their conditions say it already).
    println!("  the restarted Allot's controller writes since its start: {}", gangs::writes_by_kind(&allot.metrics));

    // The premise of the transport chosen: the API server speaks HTTP/1.1 to a webhook under a
    // host name, HTTP/2 to one on a loopback address (kubernetes#82090, #122558).
    let (used, unused) = if transport.http1 { (over_http1, over_h2) } else { (over_h2, over_http1) };
    assert!(
        !counted || (used >= 1.0 && unused == 0.0),
        "webhooks at {}: {over_http1} HTTP/1.1, {over_h2} HTTP/2 connections",
        transport.url(port)
    );
    assert_eq!(restart.ready_too_early, 0, "/readyz answered 200 before the pod cache held every pod");
    assert_eq!(tracked_after, Some(grown_pods), "after the restart allot tracks every pod");
    assert!(denied_probe_after, "allot answers after its restart (a team-less GPU pod is denied)");
    assert!(rss_empty > 0 && rss_grown > 0 && restart.settled > 0, "RSS is read from /proc");
    // Deny-mode charges wait on the API server without a thread each: concurrent clients must
    // not multiply Allot's threads (each one kept its stack and allocator caches: ~6 MiB).
    assert!(
        threads_idle > 0 && threads_busy <= threads_idle + 12,
        "{} clients took Allot from {threads_idle} to {threads_busy} threads",
        settings.clients
    );
    assert!(restart.peak >= restart.settled, "the high-water mark is at least the settled RSS");
    assert_eq!(gangs_restart.ready_too_early, 0, "ready with the gangs' members tracked, never before");
    assert!(ratio_0 > 0.0 && ratio_n > 0.0);
    assert_eq!(list_pages, grown_pods.div_ceil(500).max(1), "the paged LIST saw every pod");
    waiting.check();
    allot.stop();
}
