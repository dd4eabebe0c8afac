//! `allot serve` as a process of the scale test: started and stopped, its memory and threads
//! from /proc, the pods it tracks, and a restart at N watched until it settles.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Settings;
use crate::support::cluster::{metric, ready};
use crate::support::{self, KilledOnDrop};

/// `allot serve`, killed on drop.
pub(crate) struct Allot {
    pub(crate) child: KilledOnDrop,
    pub(crate) metrics: String,
}

impl Allot {
    /// Starts `allot serve` on `port` and returns once it prints its serving line (not once
    /// ready: the restart measurement watches that).
    pub(crate) fn spawn(bin: &Path, dir: &Path, kubeconfig: &Path, port: u16) -> Allot {
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
    pub(crate) fn memory(&self) -> (u64, u64) {
        let (rss, peak, _) = self.memory_with_anon();
        (rss, peak)
    }

    /// Resident set, its high-water mark, and its anonymous part (heap and stacks: the file-backed
    /// rest is mostly the binary's own code, which the kernel can drop and read back), in bytes.
    pub(crate) fn memory_with_anon(&self) -> (u64, u64, u64) {
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

    pub(crate) fn rss(&self) -> u64 {
        self.memory().0
    }

    /// Its number of threads, from /proc (0 once it is gone).
    pub(crate) fn threads(&self) -> usize {
        threads_of(self.child.id())
    }

    pub(crate) fn tracked_pods(&self) -> Option<usize> {
        metric(&self.metrics, "allot_cluster_pods").map(|v| v as usize)
    }

    pub(crate) fn stop(mut self) {
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

pub(crate) fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Waits until Allot's cache holds `pods` pods (at most `timeout`).
pub(crate) async fn wait_tracked(allot: &Allot, pods: usize, timeout: Duration) {
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
pub(crate) struct Restart {
    pub(crate) ready_after: f64,
    pub(crate) peak: u64,
    pub(crate) settled: u64,
    pub(crate) settled_after: f64,
    /// 1 when /readyz first answered 200 while the cache held fewer pods than exist.
    pub(crate) ready_too_early: usize,
}

impl Restart {
    /// Its figures in one line.
    pub(crate) fn summary(&self) -> String {
        format!(
            "ready after {:.2} s, peak {:.1} MiB, settled {:.1} MiB after {:.2} s (ready while under-filled: {})",
            self.ready_after,
            mib(self.peak),
            mib(self.settled),
            self.settled_after,
            self.ready_too_early
        )
    }
}

/// The other builds to restart on the same cluster, for a same-run comparison:
/// `ALLOT_SCALE_COMPARE="label=path,label=path"`, those whose binary exists.
pub(crate) fn builds_to_compare() -> Vec<(String, PathBuf)> {
    let mut builds = Vec::new();
    for entry in std::env::var("ALLOT_SCALE_COMPARE").unwrap_or_default().split(',').filter(|e| !e.is_empty()) {
        let (label, bin) = entry.split_once('=').unwrap_or((entry, entry));
        if Path::new(bin).is_file() {
            builds.push((label.to_string(), PathBuf::from(bin)));
        } else {
            println!("restart of {label}: skipped, {bin} does not exist");
        }
    }
    builds
}

/// Restarts each of `builds` in turn, as [`restart`]: the last one is left running.
pub(crate) async fn restart_each(
    mut allot: Allot,
    builds: &[(String, PathBuf)],
    settings: &Settings,
    dir: &Path,
    kubeconfig: &Path,
    port: u16,
    pods: usize,
) -> (Allot, Vec<Restart>) {
    let mut figures = Vec::new();
    for (_, bin) in builds {
        let (after, restarted) = restart(allot, bin, settings, dir, kubeconfig, port, pods).await;
        allot = after;
        figures.push(restarted);
    }
    (allot, figures)
}

/// Restarts Allot and watches it: RSS and /readyz every 50 ms, the pods it tracks when it is
/// first ready, then RSS for `observe` more. Settled = the first sample after which RSS stays
/// within 5 % above the last sample.
pub(crate) async fn restart(
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
pub(crate) async fn paged_list_secs(client: &kube::Client, from_cache: bool) -> (f64, usize) {
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

/// The number of threads of process `pid`, from /proc (0 if it is gone).
pub(crate) fn threads_of(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|n| n.trim().parse().ok()))
        .unwrap_or(0)
}
