//! Allot against the `baseline-server` example registered in its place (issue 13): creates/s
//! with each answering, and the CPU each process spends per create.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};

use crate::support::cluster::process_ticks;
use crate::support::{self, KilledOnDrop};
use crate::webhooks::point_webhooks;
use crate::{Settings, create_pods};

/// The `baseline-server` example serving Allot's certificate, killed on drop.
pub(crate) struct Baseline {
    /// Killed on drop: the server stops with the test.
    pub(crate) child: KilledOnDrop,
    pub(crate) url: String,
}

impl Baseline {
    /// With `patch` (a JSON Patch), its /mutate answers every review with that patch.
    pub(crate) fn spawn(bin: &Path, dir: &Path, patch: Option<&str>) -> Baseline {
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

/// Allot's JSON Patch for the scale test's pods: the shipped placement's toleration for
/// `nvidia.com/gpu`, appended to the two the API server's DefaultTolerationSeconds plugin set
/// first (the team's default priority class is the cluster's global default, which the API
/// server also sets first). The patching baseline's default; the test checks Allot's pods carry it.
pub(crate) const ALLOT_PATCH: &str = r#"[{"op":"add","path":"/spec/tolerations/-","value":{"effect":"NoSchedule","key":"nvidia.com/gpu","operator":"Exists"}}]"#;

/// Whether every `add` operation of `patch` (JSON Patch text) finds its value in `object`: at
/// its path, or among the list's items for a path ending in `/-`.
pub(crate) fn patch_values_present(patch: &str, object: &serde_json::Value) -> bool {
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
pub(crate) struct Contender {
    pub(crate) label: &'static str,
    pub(crate) configs: (MutatingWebhookConfiguration, ValidatingWebhookConfiguration),
    /// Allot answers (the probe is denied) or an allow-everything baseline does (admitted).
    pub(crate) is_allot: bool,
    /// Its pods carry [`ALLOT_PATCH`] (or `ALLOT_SCALE_BASELINE_PATCH`): Allot's and the
    /// patching baseline's do, the trivial webhook's do not.
    pub(crate) patches: bool,
}

/// What one contender did over the batches it answered.
#[derive(Default, Clone)]
pub(crate) struct Tally {
    pub(crate) secs: f64,
    pub(crate) creates: usize,
    /// CPU ticks per watched process, then the machine's (as [`Watched::sample`]).
    pub(crate) ticks: Vec<u64>,
    /// Creates/s of each batch, in order.
    pub(crate) batch_rates: Vec<f64>,
    /// The index of the first pod it answered for (`p-{index}`).
    pub(crate) first_pod: Option<usize>,
}

impl Tally {
    pub(crate) fn rate(&self) -> f64 {
        self.creates as f64 / self.secs.max(1e-9)
    }

    /// µs of CPU per create of watched process `i`.
    pub(crate) fn cpu_per_create(&self, i: usize) -> f64 {
        self.ticks.get(i).copied().unwrap_or(0) as f64 * 1e6 / USER_HZ / self.creates.max(1) as f64
    }
}

/// Creates/s with each contender answering, `rounds` rounds of one batch each (Allot, then each
/// baseline with Allot again between two baselines: an allow-everything baseline admits the
/// probe either way, so only a switch to or from Allot can be waited for). Leaves Allot
/// registered. Returns one tally per contender.
pub(crate) async fn baseline_ratio(
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
pub(crate) struct Watched {
    /// (label, pid): the API server, etcd, Allot, the baselines, this test (the clients).
    pub(crate) processes: Vec<(&'static str, u32)>,
}

impl Watched {
    /// CPU ticks (user + system) of each watched process, then of the whole machine (busy
    /// time from /proc/stat), in that order.
    pub(crate) fn sample(&self) -> Vec<u64> {
        let mut ticks: Vec<u64> = self.processes.iter().map(|&(_, pid)| process_ticks(pid)).collect();
        ticks.push(machine_busy_ticks());
        ticks
    }

    pub(crate) fn labels(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.processes.iter().map(|&(label, _)| label).chain(["machine"])
    }
}

/// The comparison's lines: creates/s of each contender per batch and in all, ratios of Allot
/// to each baseline, and CPU per create of each watched process under each contender.
pub(crate) fn comparison_report(
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
pub(crate) fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let numbers: Vec<u64> =
        stat.lines().next().unwrap_or_default().split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    [0, 1, 2, 5, 6].iter().filter_map(|&i| numbers.get(i)).sum()
}

/// The kernel's USER_HZ, the unit of /proc's CPU times: 100 on Linux.
pub(crate) const USER_HZ: f64 = 100.0;
