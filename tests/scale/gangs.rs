//! The waiting-gangs phase (issue 49): G incomplete gangs (`ALLOT_SCALE_GANGS`, each declaring
//! `ALLOT_SCALE_GANG_SIZE` members with one short) created through Allot on top of the N pods,
//! so every member stays behind the `allot.dev/gang` gate; once Allot has seen them and its
//! controller's writes have settled, Allot's CPU over `ALLOT_SCALE_IDLE_SECS` with nothing
//! happening (and the controller passes and writes in that window), then the wall time of a full
//! `GET /metrics`. Bars at 150,000 pods + 1,000 gangs: idle CPU under 5 % of a core, one scrape
//! under 50 ms; printed as PASS/FAIL from 100,000 pods, the loose bounds asserted at any size.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

use crate::allot_process::{Allot, Restart, mib};
use crate::baseline::USER_HZ;
use crate::support::cluster::{gang_gated, gang_member, http_get, process_ticks};
use crate::{NAMESPACES, Settings};

/// The label that names a gang (the explicit membership `support::cluster::gang_member` uses).
const GANG_LABEL: &str = "allot.dev/gang-name";
/// Full scrapes timed.
const SCRAPES: usize = 5;
/// From this many pods the run is a full-size one: the bars are printed as PASS/FAIL.
const FULL_SIZE: usize = 100_000;
/// Idle CPU bar at full size, in % of a core; the bound asserted at any size.
const IDLE_CPU_BAR: f64 = 5.0;
const IDLE_CPU_BOUND: f64 = 50.0;
/// One scrape's bar at full size; the bound asserted at any size.
const SCRAPE_BAR: Duration = Duration::from_millis(50);
const SCRAPE_BOUND: Duration = Duration::from_secs(1);
/// The controller's writes count as settled once unchanged this long: longer than the 10 s an
/// assembling gang's changed count may wait before its members' conditions say it.
const SETTLED: Duration = Duration::from_secs(15);

/// What the phase measured.
pub(crate) struct Waiting {
    gangs: usize,
    /// Members created (the gangs' declared size less one each).
    members: usize,
    /// The gang gauges once Allot had seen them: gated gang pods, gangs waiting for members,
    /// gangs the cluster view tracks, gangs released (from the first of the timed scrapes).
    gated_gauge: f64,
    waiting_gauge: f64,
    tracked_gangs: f64,
    releases: f64,
    /// Seconds from the first create until Allot counted every gang waiting, then until the
    /// controller's writes settled.
    seen_after: f64,
    settled_after: f64,
    /// The controller's writes before the window (what settling the gangs took).
    writes_to_settle: f64,
    /// Allot's CPU ticks over the idle window, and its length in seconds.
    idle_ticks: u64,
    idle_secs: f64,
    /// Controller passes and writes during the window.
    idle_passes: f64,
    idle_writes: f64,
    /// Wall time of each full scrape, and the bytes of the last.
    scrapes: Vec<Duration>,
    scrape_bytes: usize,
    /// Members still gated when listed after the window, of those listed.
    still_gated: usize,
    listed: usize,
    rss: u64,
}

/// One full `GET /metrics` from `addr`: its wall time (connect to the last byte) and body.
fn scrape(addr: &str) -> (Duration, String) {
    let started = Instant::now();
    let answer = http_get(addr, "/metrics");
    let took = started.elapsed();
    match answer {
        Some((200, body)) => (took, body),
        other => panic!("/metrics: {other:.200?}"),
    }
}

/// The value of series `name` (with its labels, as exposed) in a scrape's `text`.
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The controller's writes of every kind, summed.
fn writes(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("allot_gang_controller_writes_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The controller's writes by kind (`kind=count`, the kinds written), for a report line.
pub(crate) fn writes_by_kind(addr: &str) -> String {
    let (_, text) = scrape(addr);
    let kinds: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("allot_gang_controller_writes_total{kind=\""))
        .filter_map(|l| {
            let (kind, rest) = l.split_once('"')?;
            let n: f64 = rest.rsplit(' ').next()?.parse().ok()?;
            (n > 0.0).then(|| format!("{kind}={n}"))
        })
        .collect();
    if kinds.is_empty() { "none".into() } else { kinds.join(", ") }
}

const GATED: &str = "allot_gated_pods{gate=\"gang\"}";
const WAITING: &str = "allot_gangs_waiting{reason=\"WaitingForMembers\"}";
const PASSES: &str = "allot_gang_controller_passes_total";

/// Creates the gangs (`gang-{i}`, spread over the team's namespaces like the pods) through
/// Allot with `settings.clients` requests in flight, waits until Allot counts them all waiting
/// for members and its controller's writes have settled, then measures.
pub(crate) async fn waiting_gangs(client: &kube::Client, allot: &Allot, settings: &Settings) -> Waiting {
    let (gangs, size) = (settings.gangs, settings.gang_size);
    let members = gangs * (size - 1);
    let (_, before) = scrape(&allot.metrics);
    let gated_before = value(&before, GATED).unwrap_or(0.0);
    let started = Instant::now();
    let failures: Vec<String> = futures::stream::iter((0..gangs).flat_map(|g| (0..size - 1).map(move |m| (g, m))))
        .map(|(g, m)| {
            let client = client.clone();
            async move {
                let ns = format!("scale-{:02}", g % NAMESPACES);
                let name = format!("gang-{g}-{m}");
                let pod = gang_member(&name, &format!("gang-{g}"), size as u32);
                let pods: Api<Pod> = Api::namespaced(client, &ns);
                pods.create(&PostParams::default(), &pod).await.err().map(|e| format!("{ns}/{name}: {e}"))
            }
        })
        .buffer_unordered(settings.clients)
        .filter_map(|r| async move { r })
        .collect()
        .await;
    assert!(failures.is_empty(), "{} of {members} gang member creates failed, first: {}", failures.len(), failures[0]);

    // Seen: every member behind the gate and every gang waiting for members (the leader's count).
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (_, text) = scrape(&allot.metrics);
        let gated = value(&text, GATED).unwrap_or(0.0);
        let waiting = value(&text, WAITING).unwrap_or(0.0);
        if gated >= gated_before + members as f64 && waiting >= gangs as f64 {
            break;
        }
        assert!(Instant::now() < deadline, "within 300 s Allot counted {gated} gated pods, {waiting} gangs waiting");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seen_after = started.elapsed().as_secs_f64();
    // Settled: the controller's writes (conditions and events on the members) unchanged for
    // SETTLED, so the window below has nothing left to do.
    let mut last = (writes(&scrape(&allot.metrics).1), Instant::now());
    while last.1.elapsed() < SETTLED {
        assert!(started.elapsed() < Duration::from_secs(900), "the controller's writes never settled");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = writes(&scrape(&allot.metrics).1);
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    let settled_after = started.elapsed().as_secs_f64();

    // The window: nothing created, nothing scraped.
    let (_, text) = scrape(&allot.metrics);
    let (passes_before, writes_before) = (value(&text, PASSES).unwrap_or(0.0), writes(&text));
    let (ticks_before, window) = (process_ticks(allot.child.id()), Instant::now());
    tokio::time::sleep(settings.idle).await;
    let (idle_ticks, idle_secs) =
        (process_ticks(allot.child.id()).saturating_sub(ticks_before), window.elapsed().as_secs_f64());
    let (_, text) = scrape(&allot.metrics);
    let (idle_passes, idle_writes) =
        (value(&text, PASSES).unwrap_or(0.0) - passes_before, writes(&text) - writes_before);

    let mut scrapes = Vec::new();
    let mut last_text = String::new();
    for _ in 0..SCRAPES {
        let (took, text) = scrape(&allot.metrics);
        scrapes.push(took);
        last_text = text;
    }
    let listed: Vec<Pod> = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().labels(GANG_LABEL))
        .await
        .expect("the gang members")
        .items;
    Waiting {
        gangs,
        members,
        gated_gauge: value(&last_text, GATED).unwrap_or(-1.0) - gated_before,
        waiting_gauge: value(&last_text, WAITING).unwrap_or(-1.0),
        tracked_gangs: value(&last_text, "allot_cluster_gangs").unwrap_or(-1.0),
        releases: value(&last_text, "allot_gang_releases_total").unwrap_or(-1.0),
        seen_after,
        settled_after,
        writes_to_settle: writes_before,
        idle_ticks,
        idle_secs,
        idle_passes,
        idle_writes,
        scrapes,
        scrape_bytes: last_text.len(),
        still_gated: listed.iter().filter(|p| gang_gated(p)).count(),
        listed: listed.len(),
        rss: allot.rss(),
    }
}

impl Waiting {
    /// Allot's CPU over the window, in % of one core.
    fn idle_cpu(&self) -> f64 {
        self.idle_ticks as f64 / USER_HZ / self.idle_secs.max(1e-9) * 100.0
    }

    fn scrape_median(&self) -> Duration {
        let mut sorted = self.scrapes.clone();
        sorted.sort();
        sorted[sorted.len() / 2]
    }

    fn scrape_max(&self) -> Duration {
        self.scrapes.iter().copied().max().unwrap_or_default()
    }

    /// The phase's report lines, with the bars as PASS/FAIL in a full-size run.
    pub(crate) fn report(&self, settings: &Settings, pods: usize) -> Vec<String> {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut lines = vec![
            format!(
                "waiting gangs: {} gangs of {} with {} members each ({} gated pods beside {pods} others): seen after \
                 {:.1} s, settled after {:.1} s ({} controller writes); RSS {:.1} MiB",
                self.gangs,
                settings.gang_size,
                settings.gang_size - 1,
                self.members,
                self.seen_after,
                self.settled_after,
                self.writes_to_settle,
                mib(self.rss)
            ),
            format!(
                "waiting gangs: idle CPU {:.1}% of a core over {:.0} s ({} ticks), {} controller passes, {} controller \
                 writes; /metrics scrape median {:.1} ms max {:.1} ms ({} KB, {SCRAPES} scrapes)",
                self.idle_cpu(),
                self.idle_secs,
                self.idle_ticks,
                self.idle_passes,
                self.idle_writes,
                ms(self.scrape_median()),
                ms(self.scrape_max()),
                self.scrape_bytes / 1024
            ),
        ];
        if settings.pods >= FULL_SIZE {
            let verdict = |pass: bool| if pass { "PASS" } else { "FAIL" };
            lines.push(format!(
                "waiting gangs bars: idle CPU < {IDLE_CPU_BAR}% of a core: {}; one scrape < {} ms: {} (median), {} (max)",
                verdict(self.idle_cpu() < IDLE_CPU_BAR),
                SCRAPE_BAR.as_millis(),
                verdict(self.scrape_median() < SCRAPE_BAR),
                verdict(self.scrape_max() < SCRAPE_BAR)
            ));
        }
        lines
    }

    /// What must hold at any size: no gang released (none is complete), every member still
    /// gated, the gauges counting them, and the loose bounds.
    /// The gangs' members created.
    pub(crate) fn members(&self) -> usize {
        self.members
    }

    pub(crate) fn check(&self) {
        assert_eq!(self.releases, 0.0, "an incomplete gang was released");
        assert_eq!((self.listed, self.still_gated), (self.members, self.members), "(members listed, still gated)");
        assert_eq!(self.gated_gauge, self.members as f64, "allot_gated_pods{{gate=\"gang\"}} counts every member");
        assert_eq!(self.waiting_gauge, self.gangs as f64, "allot_gangs_waiting counts every gang waiting for members");
        assert_eq!(self.tracked_gangs, self.gangs as f64, "allot_cluster_gangs counts every gang");
        assert_eq!(self.idle_writes, 0.0, "the controller wrote with nothing changing");
        assert!(
            self.idle_cpu() < IDLE_CPU_BOUND,
            "Allot took {:.1}% of a core with nothing happening",
            self.idle_cpu()
        );
        assert!(self.scrape_max() < SCRAPE_BOUND, "a /metrics scrape took {:?}", self.scrape_max());
    }
}

/// What waiting gangs cost at rest: the settled RSS of a restart with them waiting against the
/// restart without them, per gang, and what of it their members would cost as plain pods
/// (`grown`: bytes over empty and the pods they were measured at).
pub(crate) fn at_rest(waiting: &Waiting, without: &Restart, with: &Restart, grown: (u64, usize)) -> Vec<String> {
    let gangs = waiting.gangs.max(1) as f64;
    let delta = with.settled as f64 - without.settled as f64;
    let per_pod = grown.0 as f64 / grown.1.max(1) as f64;
    let as_pods = per_pod * waiting.members as f64;
    vec![
        format!(
            "restart with {} gangs waiting:     ready after {:.2} s, peak RSS {:.1} MiB (without them {:.1}), settled {:.1} MiB ({:+.1} MiB over the restart without them)",
            waiting.gangs,
            with.ready_after,
            mib(with.peak),
            mib(without.peak),
            mib(with.settled),
            delta / 1_048_576.0
        ),
        format!(
            "  per waiting gang of {} members:  {:.1} KiB ({:.1} KiB as plain pods at {:.0} bytes/pod, {:.1} KiB beyond)",
            waiting.members as f64 / gangs,
            delta / gangs / 1024.0,
            as_pods / gangs / 1024.0,
            per_pod,
            (delta - as_pods) / gangs / 1024.0
        ),
    ]
}
