//! Allot at cluster scale (issue 18), on a real kube-apiserver + etcd (skipped without the
//! envtest binaries): `allot serve` registered as both webhooks, one Team owning 20 namespaces
//! with a large deny quota, N one-GPU pods created through it by concurrent clients (no
//! scheduler: they stay Pending). Prints what Allot's memory does — RSS empty, grown at N, and
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

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::KilledOnDrop;
use support::cluster::{ControlPlane, binaries_from_env, metric, process_ticks, ready};

/// Namespaces the scale team owns.
const NAMESPACES: usize = 20;
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
        }
    }
}

/// `allot serve`, killed on drop.
struct Allot {
    child: KilledOnDrop,
    metrics: String,
}

impl Allot {
    /// Starts `allot serve` on `port` and returns once it prints its serving line (not once
    /// ready: the restart measurement watches that).
    fn spawn(bin: &Path, dir: &Path, kubeconfig: &Path, port: u16) -> Allot {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("allot.log")).expect("log");
        let mut child = Command::new(bin)
            .args(["serve", "--policies"])
            .arg(dir.join("policies"))
            .arg("--tls-cert")
            .arg(dir.join("allot-certs/tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("allot-certs/tls.key"))
            .args(["--addr", &format!("127.0.0.1:{port}"), "--metrics-addr", "127.0.0.1:0"])
            .args(["--lease-namespace", "default", "--identity", "scale"])
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("allot serve");
        let stdout = child.stdout.take().expect("stdout");
        let line = support::first_line(stdout, Duration::from_secs(30)).expect("allot serve did not start");
        let (_, metrics) = support::serving_addresses(&line).expect("metrics address");
        Allot { child: KilledOnDrop::new(child), metrics }
    }

    /// Resident set and its high-water mark, in bytes, from /proc.
    fn memory(&self) -> (u64, u64) {
        let (rss, peak, _) = self.memory_with_anon();
        (rss, peak)
    }

    /// Resident set, its high-water mark, and its anonymous part (heap and stacks: the file-backed
    /// rest is mostly the binary's own code, which the kernel can drop and read back), in bytes.
    fn memory_with_anon(&self) -> (u64, u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |kib| kib * 1024)
        };
        (field("VmRSS:"), field("VmHWM:"), field("RssAnon:"))
    }

    fn rss(&self) -> u64 {
        self.memory().0
    }

    /// Its number of threads, from /proc (0 once it is gone).
    fn threads(&self) -> usize {
        threads_of(self.child.id())
    }

    fn tracked_pods(&self) -> Option<usize> {
        metric(&self.metrics, "allot_cluster_pods").map(|v| v as usize)
    }

    fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Creates pods `from..from + count` (one GPU each, spread over the team's namespaces) with
/// `clients` requests in flight; returns the seconds taken and the failures.
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
                let request = axum::http::Request::post(format!("/api/v1/namespaces/{ns}/pods"))
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&body).unwrap_or_default());
                match request {
                    Ok(r) => client.request_text(r).await.err().map(|e| format!("{ns}/p-{i}: {e}")),
                    Err(e) => Some(e.to_string()),
                }
            }
        })
        .buffer_unordered(clients)
        .filter_map(|r| async move { r })
        .collect()
        .await;
    (started.elapsed().as_secs_f64(), failures)
}

/// The webhook configurations `allot webhooks` prints for an Allot at `url`.
fn webhook_configs(bin: &Path, ca: &Path, url: &str) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let out =
        Command::new(bin).arg("webhooks").arg("--ca-bundle").arg(ca).args(["--url", url]).output().expect("webhooks");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&out.stdout)).expect("webhook yaml");
    (
        serde_json::from_value(docs[0].clone()).expect("mutating"),
        serde_json::from_value(docs[1].clone()).expect("validating"),
    )
}

/// Registers or removes Allot's webhooks and waits until the API server acts on the change
/// (a team-less GPU pod in the probe namespace is denied with them, admitted without).
async fn set_webhooks(
    client: &kube::Client,
    configs: &(MutatingWebhookConfiguration, ValidatingWebhookConfiguration),
    on: bool,
) {
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let (m_name, v_name) =
        (configs.0.metadata.name.clone().unwrap_or_default(), configs.1.metadata.name.clone().unwrap_or_default());
    // Idempotent: already there (409) or already gone (404) is what was asked for.
    let settled = |r: Result<(), kube::Error>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
        other => other.unwrap_or_else(|e| panic!("{what}: {e}")),
    };
    if on {
        settled(m.create(&PostParams::default(), &configs.0).await.map(drop), "mutating webhook");
        settled(v.create(&PostParams::default(), &configs.1).await.map(drop), "validating webhook");
    } else {
        settled(m.delete(&m_name, &DeleteParams::default()).await.map(drop), "delete mutating webhook");
        settled(v.delete(&v_name, &DeleteParams::default()).await.map(drop), "delete validating webhook");
    }
    wait_for_probe(client, !on, &format!("the API server picks up the webhook change (on = {on})")).await;
}

/// Creates/s with Allot as a ratio to no webhook: `rounds` alternations of one batch each way.
/// Leaves the webhooks registered. Returns (ratio, with/s, without/s) and advances `next`.
async fn create_ratio(
    client: &kube::Client,
    configs: &(MutatingWebhookConfiguration, ValidatingWebhookConfiguration),
    settings: &Settings,
    next: &mut usize,
) -> (f64, f64, f64) {
    let (mut with, mut without) = ((0.0, 0usize), (0.0, 0usize));
    for _ in 0..settings.rounds {
        for on in [true, false] {
            set_webhooks(client, configs, on).await;
            let (secs, failures) = create_pods(client, *next, settings.batch, settings.clients).await;
            assert!(failures.is_empty(), "{} creates failed, first: {}", failures.len(), failures[0]);
            *next += settings.batch;
            let slot = if on { &mut with } else { &mut without };
            slot.0 += secs;
            slot.1 += settings.batch;
        }
    }
    set_webhooks(client, configs, true).await;
    let rate = |(secs, n): (f64, usize)| n as f64 / secs.max(1e-9);
    (rate(with) / rate(without), rate(with), rate(without))
}

/// The `baseline-server` example serving Allot's certificate, killed on drop.
struct Baseline {
    /// Killed on drop: the server stops with the test.
    child: KilledOnDrop,
    url: String,
}

impl Baseline {
    /// With `patch` (a JSON Patch), its /mutate answers every review with that patch.
    fn spawn(bin: &Path, dir: &Path, patch: Option<&str>) -> Baseline {
        let mut command = Command::new(bin);
        command
            .arg("--tls-cert")
            .arg(dir.join("allot-certs/tls.crt"))
            .arg("--tls-key")
            .arg(dir.join("allot-certs/tls.key"))
            .args(["--addr", "127.0.0.1:0"]);
        if let Some(patch) = patch {
            command.arg("--mutate-patch").arg(patch);
            // ALLOT_SCALE_PATCHING_ARGS: more flags for the patching baseline (`--spin-us 100`:
            // as slow as a webhook that evaluates for 100 µs).
            command.args(std::env::var("ALLOT_SCALE_PATCHING_ARGS").unwrap_or_default().split_whitespace());
        }
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("baseline-server");
        let stdout = child.stdout.take().expect("stdout");
        let line = support::first_line(stdout, Duration::from_secs(30)).expect("baseline-server did not start");
        let url =
            line.split_whitespace().last().filter(|u| u.starts_with("https://")).expect("baseline url").to_string();
        Baseline { child: KilledOnDrop::new(child), url }
    }
}

/// A team-less one-GPU pod: Allot denies it, an allow-everything webhook admits it.
fn probe(name: &str) -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "w", "image": "busybox:1.36", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .expect("probe pod")
}

/// Creates the probe until the API server admits it (`admitted`) or refuses it, deleting it
/// each time it got in; fails after 60 s, saying what it waited for.
async fn wait_for_probe(client: &kube::Client, admitted: bool, what: &str) {
    let probes: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), PROBE_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got_in = probes.create(&PostParams::default(), &probe("probe")).await.is_ok();
        if got_in {
            let _ = probes.delete("probe", &DeleteParams::default().grace_period(0)).await;
            // Wait for it to be gone, so the next probe's create does not collide.
            while probes.get_opt("probe").await.ok().flatten().is_some() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if got_in == admitted {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Points the registered webhook configurations (same names) at another server by replacing
/// their webhook lists, then waits until the API server acts on it: the probe (a team-less GPU
/// pod) is denied while Allot answers and admitted once the allow-everything baseline does.
async fn point_webhooks(
    client: &kube::Client,
    configs: &(MutatingWebhookConfiguration, ValidatingWebhookConfiguration),
    allot_answers: bool,
) {
    let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let v: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name =
        |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| meta.name.clone().unwrap_or_default();
    m.patch(&name(&configs.0.metadata), &PatchParams::default(), &Patch::Merge(&configs.0))
        .await
        .expect("patch mutating");
    v.patch(&name(&configs.1.metadata), &PatchParams::default(), &Patch::Merge(&configs.1))
        .await
        .expect("patch validating");
    wait_for_probe(
        client,
        !allot_answers,
        &format!("the API server switches webhook servers (to allot = {allot_answers})"),
    )
    .await;
}

/// Allot's JSON Patch for the scale test's pods: the shipped placement's toleration for
/// `nvidia.com/gpu`, appended to the two the API server's DefaultTolerationSeconds plugin set
/// first (the team's default priority class is the cluster's global default, which the API
/// server also sets first). The patching baseline's default; the test checks Allot's pods carry it.
const ALLOT_PATCH: &str = r#"[{"op":"add","path":"/spec/tolerations/-","value":{"effect":"NoSchedule","key":"nvidia.com/gpu","operator":"Exists"}}]"#;

/// Whether every `add` operation of `patch` (JSON Patch text) finds its value in `object`: at
/// its path, or among the list's items for a path ending in `/-`.
fn patch_values_present(patch: &str, object: &serde_json::Value) -> bool {
    let ops: Vec<serde_json::Value> = serde_json::from_str(patch).expect("ALLOT_SCALE_BASELINE_PATCH is a JSON array");
    ops.iter().filter(|op| op["op"] == "add").all(|op| {
        let path = op["path"].as_str().unwrap_or_default();
        match path.strip_suffix("/-") {
            Some(list) => object.pointer(list).and_then(|l| l.as_array()).is_some_and(|l| l.contains(&op["value"])),
            None => object.pointer(path) == Some(&op["value"]),
        }
    })
}

/// A webhook server the comparison with the trivial webhook registers in Allot's place.
struct Contender {
    label: &'static str,
    configs: (MutatingWebhookConfiguration, ValidatingWebhookConfiguration),
    /// Allot answers (the probe is denied) or an allow-everything baseline does (admitted).
    is_allot: bool,
    /// Its pods carry [`ALLOT_PATCH`] (or `ALLOT_SCALE_BASELINE_PATCH`): Allot's and the
    /// patching baseline's do, the trivial webhook's do not.
    patches: bool,
}

/// What one contender did over the batches it answered.
#[derive(Default, Clone)]
struct Tally {
    secs: f64,
    creates: usize,
    /// CPU ticks per watched process, then the machine's (as [`Watched::sample`]).
    ticks: Vec<u64>,
    /// Creates/s of each batch, in order.
    batch_rates: Vec<f64>,
    /// The index of the first pod it answered for (`p-{index}`).
    first_pod: Option<usize>,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.creates as f64 / self.secs.max(1e-9)
    }

    /// µs of CPU per create of watched process `i`.
    fn cpu_per_create(&self, i: usize) -> f64 {
        self.ticks.get(i).copied().unwrap_or(0) as f64 * 1e6 / USER_HZ / self.creates.max(1) as f64
    }
}

/// Creates/s with each contender answering, `rounds` rounds of one batch each (Allot, then each
/// baseline with Allot again between two baselines: an allow-everything baseline admits the
/// probe either way, so only a switch to or from Allot can be waited for). Leaves Allot
/// registered. Returns one tally per contender.
async fn baseline_ratio(
    client: &kube::Client,
    contenders: &[Contender],
    settings: &Settings,
    next: &mut usize,
    watched: &Watched,
) -> Vec<Tally> {
    let mut tallies = vec![Tally::default(); contenders.len()];
    let allot = contenders.iter().position(|c| c.is_allot).expect("Allot is a contender");
    let mut order: Vec<usize> = Vec::new();
    for i in (0..contenders.len()).filter(|&i| !contenders[i].is_allot) {
        if order.last().is_none_or(|&last| !contenders[last].is_allot) {
            order.push(allot);
        }
        order.push(i);
    }
    for _ in 0..settings.rounds {
        for &i in &order {
            let contender = &contenders[i];
            point_webhooks(client, &contender.configs, contender.is_allot).await;
            let before = watched.sample();
            let (secs, failures) = create_pods(client, *next, settings.batch, settings.clients).await;
            let after = watched.sample();
            assert!(failures.is_empty(), "{} creates failed, first: {}", failures.len(), failures[0]);
            *next += settings.batch;
            let tally = &mut tallies[i];
            tally.first_pod.get_or_insert(*next - settings.batch);
            tally.secs += secs;
            tally.creates += settings.batch;
            tally.ticks.resize(after.len(), 0);
            for (sum, (a, b)) in tally.ticks.iter_mut().zip(after.iter().zip(&before)) {
                *sum += a.saturating_sub(*b);
            }
            tally.batch_rates.push(settings.batch as f64 / secs.max(1e-9));
        }
    }
    point_webhooks(client, &contenders[allot].configs, true).await;
    tallies
}

/// The processes whose CPU time the comparison with the trivial webhook accounts per create:
/// where a gap in creates/s goes (a webhook's own CPU, or the API server's and etcd's work
/// on what it answered) on a machine too noisy for the rates alone to say.
struct Watched {
    /// (label, pid): the API server, etcd, Allot, the baselines, this test (the clients).
    processes: Vec<(&'static str, u32)>,
}

impl Watched {
    /// CPU ticks (user + system) of each watched process, then of the whole machine (busy
    /// time from /proc/stat), in that order.
    fn sample(&self) -> Vec<u64> {
        let mut ticks: Vec<u64> = self.processes.iter().map(|&(_, pid)| process_ticks(pid)).collect();
        ticks.push(machine_busy_ticks());
        ticks
    }

    fn labels(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.processes.iter().map(|&(label, _)| label).chain(["machine"])
    }
}

/// The comparison's lines: creates/s of each contender per batch and in all, ratios of Allot
/// to each baseline, and CPU per create of each watched process under each contender.
fn comparison_report(
    contenders: &[Contender],
    tallies: &[Tally],
    watched: &Watched,
    settings: &Settings,
) -> Vec<String> {
    let mut lines = Vec::new();
    let Some(allot) = contenders.iter().position(|c| c.is_allot) else { return lines };
    for (contender, tally) in contenders.iter().zip(tallies) {
        let batches: Vec<String> = tally.batch_rates.iter().map(|r| format!("{r:.1}")).collect();
        lines.push(format!(
            "creates/s answered by {:<18} {:7.1} (batches: {})",
            contender.label,
            tally.rate(),
            batches.join(", ")
        ));
    }
    for (contender, tally) in contenders.iter().zip(tallies).filter(|(c, _)| !c.is_allot) {
        lines.push(format!(
            "creates/s vs {}: with Allot {:7.1}, with it {:7.1}, ratio {:.3} ({} rounds of {} pods per batch, {} clients)",
            contender.label,
            tallies[allot].rate(),
            tally.rate(),
            tallies[allot].rate() / tally.rate().max(1e-9),
            settings.rounds,
            settings.batch,
            settings.clients
        ));
    }
    for (i, label) in watched.labels().enumerate() {
        let per: Vec<String> = contenders
            .iter()
            .zip(tallies)
            .map(|(c, t)| format!("{} {:6.0} µs", c.label, t.cpu_per_create(i)))
            .collect();
        lines.push(format!("CPU per create, {label:<14} answered by {}", per.join(", ")));
    }
    lines
}

/// Busy CPU ticks of the whole machine from /proc/stat's first line: user, nice, system, irq
/// and softirq (not idle, iowait, the hypervisor's steal, nor guest time, already in user).
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let numbers: Vec<u64> =
        stat.lines().next().unwrap_or_default().split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    [0, 1, 2, 5, 6].iter().filter_map(|&i| numbers.get(i)).sum()
}

/// The kernel's USER_HZ, the unit of /proc's CPU times: 100 on Linux.
const USER_HZ: f64 = 100.0;

/// Waits until Allot's cache holds `pods` pods (at most `timeout`).
async fn wait_tracked(allot: &Allot, pods: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while allot.tracked_pods() != Some(pods) {
        assert!(
            Instant::now() < deadline,
            "allot tracks {:?} pods, expected {pods} within {timeout:?}",
            allot.tracked_pods()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a restart at N did.
struct Restart {
    ready_after: f64,
    peak: u64,
    settled: u64,
    settled_after: f64,
    /// 1 when /readyz first answered 200 while the cache held fewer pods than exist.
    ready_too_early: usize,
}

/// Restarts Allot and watches it: RSS and /readyz every 50 ms, the pods it tracks when it is
/// first ready, then RSS for `observe` more. Settled = the first sample after which RSS stays
/// within 5 % above the last sample.
async fn restart(
    old: Allot,
    bin: &Path,
    settings: &Settings,
    dir: &Path,
    kubeconfig: &Path,
    port: u16,
    pods: usize,
) -> (Allot, Restart) {
    old.stop();
    let started = Instant::now();
    let allot = Allot::spawn(bin, dir, kubeconfig, port);
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let (mut ready_after, mut ready_too_early) = (None, 0);
    // ALLOT_SCALE_TIMELINE=1: RSS and its anonymous part once a second, to see where a
    // restart's memory goes.
    let timeline = std::env::var_os("ALLOT_SCALE_TIMELINE").is_some();
    let mut next_line = 0.0;
    loop {
        let now = started.elapsed().as_secs_f64();
        let (rss, _, anon) = allot.memory_with_anon();
        samples.push((now, rss));
        if timeline && now >= next_line {
            println!("  {now:5.1} s  RSS {:6.1} MiB  anonymous {:6.1} MiB", mib(rss), mib(anon));
            next_line += 1.0;
        }
        // /metrics walks every pod (the team gauges): read it once when ready, not on every
        // sample, or the scrapes themselves slow the fill they measure.
        if ready_after.is_none() && ready(&allot.metrics) {
            if allot.tracked_pods().is_some_and(|n| n < pods) {
                ready_too_early += 1;
            }
            ready_after = Some(now);
        }
        if let Some(at) = ready_after
            && now > at + settings.observe.as_secs_f64()
        {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(600), "allot did not get ready within 600 s of a restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready_after = ready_after.unwrap_or_default();
    let last = samples.last().map_or(0, |s| s.1);
    // Settled: no sample after it is more than 5 % above the last one. (A short dip below and
    // back, seen ~10 s after a restart, is no settling; 2 % of a 60 MiB figure was such noise.)
    let above = |rss: u64| rss as f64 > last as f64 * 1.05;
    let settled_index = samples.iter().rposition(|s| above(s.1)).map_or(0, |i| i + 1);
    let settled_after = samples.get(settled_index).map_or(ready_after, |s| s.0);
    let peak = allot.memory().1;
    (allot, Restart { ready_after, peak, settled: last, settled_after, ready_too_early })
}

/// How long the API server alone takes to serve every Pod as a paged LIST (500 a page, the
/// bytes read and dropped): the floor under Allot's restart, measured in the same run. With
/// `from_cache` the first page asks for `resourceVersion=0` (any version, served from the API
/// server's watch cache instead of etcd); the page count says whether it honoured the limit.
async fn paged_list_secs(client: &kube::Client, from_cache: bool) -> (f64, usize) {
    let started = Instant::now();
    let (mut token, mut pages) = (String::new(), 0);
    loop {
        let uri = if from_cache && token.is_empty() {
            "/api/v1/pods?limit=500&resourceVersion=0&resourceVersionMatch=NotOlderThan".to_string()
        } else {
            format!("/api/v1/pods?limit=500&continue={token}")
        };
        let page = client
            .request_text(axum::http::Request::get(uri).body(Vec::new()).expect("request"))
            .await
            .expect("a page of the Pod list");
        pages += 1;
        // The list's metadata comes before its items: `"continue":"TOKEN"` when more follow.
        let head = &page[..page.find("\"items\"").unwrap_or(page.len())];
        match head.split("\"continue\":\"").nth(1).and_then(|rest| rest.split('"').next()) {
            Some(next) if !next.is_empty() => token = next.to_string(),
            _ => break,
        }
    }
    (started.elapsed().as_secs_f64(), pages)
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
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss_grown, _, anon_grown) = allot.memory_with_anon();
    let grown_pods = next;

    // Other builds (another allocator, the code before a change) restarted on the same cluster,
    // for a same-run comparison: ALLOT_SCALE_COMPARE="label=path,label=path".
    let mut compared = Vec::new();
    for entry in std::env::var("ALLOT_SCALE_COMPARE").unwrap_or_default().split(',').filter(|e| !e.is_empty()) {
        let (label, bin) = entry.split_once('=').unwrap_or((entry, entry));
        if !Path::new(bin).is_file() {
            println!("restart of {label}: skipped, {bin} does not exist");
            continue;
        }
        let (after, figures) = restart(allot, Path::new(bin), &settings, &dir, &plane.kubeconfig, port, next).await;
        allot = after;
        compared.push((label.to_string(), figures));
    }
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
        "== allot at scale: {grown_pods} pods ({} filled through Allot at {fill_rate:.0}/s, {} clients)",
        settings.pods, settings.clients
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
    for (label, r) in &compared {
        println!(
            "restart of {label}: ready after {:.2} s, peak {:.1} MiB, settled {:.1} MiB after {:.2} s (ready while under-filled: {})",
            r.ready_after,
            mib(r.peak),
            mib(r.settled),
            r.settled_after,
            r.ready_too_early
        );
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
    assert!(ratio_0 > 0.0 && ratio_n > 0.0);
    assert_eq!(list_pages, grown_pods.div_ceil(500).max(1), "the paged LIST saw every pod");
    allot.stop();
}

/// Where the webhooks are registered, which decides how the API server talks to them: HTTP/2
/// (one connection for every concurrent call) to a URL on a loopback address or `localhost`
/// (kubernetes#122558), HTTP/1.1 (a connection per concurrent call, kept alive) to any other
/// host, as to a Service webhook in a cluster (kubernetes#82090, #75791). A name of this machine
/// that resolves to loopback addresses only gets the production transport while staying on
/// loopback; without one (or with `ALLOT_SCALE_TRANSPORT=h2`) the URL is 127.0.0.1.
struct Transport {
    host: String,
    http1: bool,
    why: String,
}

impl Transport {
    fn choose() -> Transport {
        let loopback =
            |host: &str| Transport { host: "127.0.0.1".to_string(), http1: false, why: format!("HTTP/2: {host}") };
        if std::env::var("ALLOT_SCALE_TRANSPORT").is_ok_and(|t| t == "h2") {
            return loopback("a loopback address, as ALLOT_SCALE_TRANSPORT=h2 asks");
        }
        // From /etc/hosts, not the resolver: no DNS query leaves the machine, and the API server
        // (Go's resolver reads the same file first) finds the same address.
        let nsswitch = std::fs::read_to_string("/etc/nsswitch.conf").unwrap_or_default();
        if !hosts_file_first(&nsswitch) {
            return loopback("a loopback address: /etc/nsswitch.conf asks DNS before /etc/hosts");
        }
        let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        let this_machine = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        match loopback_only_name(&hosts, &this_machine) {
            Some(name) => Transport {
                why: format!("HTTP/1.1 as to a Service webhook: /etc/hosts maps {name} to 127.0.0.1"),
                host: name,
                http1: true,
            },
            None => loopback("a loopback address: /etc/hosts maps no name but localhost to 127.0.0.1 alone"),
        }
    }

    fn url(&self, port: u16) -> String {
        format!("https://{}:{port}", self.host)
    }

    /// `url` (a server on 127.0.0.1) under this transport's host.
    fn same_host(&self, url: &str) -> String {
        url.replacen("127.0.0.1", &self.host, 1)
    }
}

/// True when host names are looked up in `/etc/hosts` before anything else (`nsswitch`: the
/// text of `/etc/nsswitch.conf`; without a `hosts:` line, resolvers read the file first): a
/// name from it then never waits on a DNS server this machine may not reach.
fn hosts_file_first(nsswitch: &str) -> bool {
    let sources = nsswitch.lines().find_map(|l| l.split('#').next()?.trim().strip_prefix("hosts:"));
    sources.is_none_or(|s| s.split_whitespace().next().is_none_or(|first| first == "files"))
}

#[test]
fn names_are_taken_from_etc_hosts_only_when_it_is_read_first() {
    assert!(hosts_file_first(""), "no nsswitch.conf: files first");
    assert!(hosts_file_first("passwd: files\nhosts:          files dns\n"));
    assert!(hosts_file_first("hosts: files mdns4_minimal [NOTFOUND=return] dns myhostname\n"));
    assert!(!hosts_file_first("hosts: dns files\n"));
    assert!(!hosts_file_first("# comment\nhosts: myhostname files\n"));
    assert!(hosts_file_first("# hosts: dns\nhosts: files\n"), "a commented line is no setting");
}

/// A name `/etc/hosts` (its text: `hosts`) maps to 127.0.0.1 and nothing else, other than
/// `localhost…` (which the API server treats as loopback): `preferred` when it is one.
fn loopback_only_name(hosts: &str, preferred: &str) -> Option<String> {
    // Names compared without case, as resolvers read the file.
    let mut addresses: std::collections::HashMap<String, Vec<&str>> = std::collections::HashMap::new();
    let mut order = Vec::new();
    for line in hosts.lines() {
        let mut fields = line.split('#').next().unwrap_or_default().split_whitespace();
        let Some(ip) = fields.next() else { continue };
        for name in fields.map(str::to_ascii_lowercase) {
            if !addresses.contains_key(&name) {
                order.push(name.clone());
            }
            addresses.entry(name).or_default().push(ip);
        }
    }
    let usable = |name: &str| {
        !name.starts_with("localhost")
            && !name.ends_with(".localhost")
            && name.parse::<std::net::IpAddr>().is_err()
            && addresses[name].iter().all(|ip| *ip == "127.0.0.1")
    };
    let preferred = preferred.to_ascii_lowercase();
    order.iter().find(|n| **n == preferred && usable(n)).or_else(|| order.iter().find(|n| usable(n))).cloned()
}

#[test]
fn the_webhook_host_is_a_name_for_127_0_0_1_alone() {
    let hosts = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n127.0.0.1 runsc # a comment\n127.0.0.1 vm\n\
                 127.0.1.1 debian\n127.0.0.1 both\n::1 both\n# 127.0.0.1 commented\n";
    assert_eq!(loopback_only_name(hosts, "vm").as_deref(), Some("vm"), "the machine's own name first");
    assert_eq!(loopback_only_name(hosts, "debian").as_deref(), Some("runsc"), "127.0.1.1: not where Allot listens");
    assert_eq!(loopback_only_name(hosts, "both").as_deref(), Some("runsc"), "also ::1: a dial might go there");
    assert_eq!(loopback_only_name("127.0.0.1 localhost localhost.localdomain\n", ""), None);
    assert_eq!(loopback_only_name("", "vm"), None);
    assert_eq!(loopback_only_name("127.0.0.1 commented\n", "x").as_deref(), Some("commented"));
    assert_eq!(loopback_only_name("# 127.0.0.1 commented\n", "x"), None);
    assert_eq!(loopback_only_name("127.0.0.1 VM\n::1 vm\n", "vm"), None, "one name, whatever its case");
    assert_eq!(loopback_only_name("127.0.0.1 Box\n", "box").as_deref(), Some("box"));
    assert_eq!(loopback_only_name("127.0.0.1 app.localhost\n", ""), None, "*.localhost is loopback to resolvers");
}

/// The number of threads of process `pid`, from /proc (0 if it is gone).
fn threads_of(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|n| n.trim().parse().ok()))
        .unwrap_or(0)
}
