//! Heap allocations per admission review, counted by a global allocator in this test binary.
//!
//! On a shared, noisy machine time is not a stable measure, but the number of allocations a
//! review makes is: it moves only when the code does. Each case runs `admission::review` (decode,
//! engine, encode: what `POST /mutate` and `POST /validate` do) on a captured AdmissionReview
//! against the shipped `policies/`, checks the answer is the real one (not an early exit), and
//! asserts a ceiling on the allocations per review. A change that adds allocations to the
//! request path fails here; one that removes many should lower the ceiling (numbers measured
//! are printed with `--nocapture`, and recorded in benches/README.md).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use allot::admission::engine::Engine;
use allot::admission::{self, Phase};
use allot::model::namespaces::{self, StaticNamespaces};
use allot::model::policy::{self, PolicySet};

/// Counts the allocations made on the current thread (tests run on threads of their own, so
/// one test's count is not another's).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

fn count_one(bytes: usize) {
    // `try_with`: the allocator may be called while a thread's locals are being torn down.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    let _ = BYTES.try_with(|n| n.set(n.get() + bytes as u64));
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only a
// const-initialised thread-local `Cell`, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one(new_size);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Bytes asked of the allocator on the current thread (a realloc counts its new size).
fn allocated_bytes() -> u64 {
    BYTES.with(Cell::get)
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn policies() -> PolicySet {
    policy::load_dir(&repo().join("policies")).unwrap_or_else(|e| panic!("policies/: {e}"))
}

/// Namespace labels as a server with the Namespace watch would know them.
fn namespaces() -> StaticNamespaces {
    let path = repo().join("examples/cluster/namespaces.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    namespaces::from_manifests(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"))
}

fn fixture(name: &str) -> Vec<u8> {
    let path = repo().join("tests/fixtures/admission-reviews").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

const ROUNDS: u64 = 50;

/// Allocations per review of `body` (averaged over [`ROUNDS`], after one warm-up review that
/// fills lazily built state), and the answer.
fn per_review(engine: &Engine<'_>, body: &[u8], phase: Phase) -> (u64, admission::Answer) {
    let warm = admission::review(body, phase, engine).expect("a valid review");
    let before = allocations();
    for _ in 0..ROUNDS {
        let answer = admission::review(body, phase, engine).expect("a valid review");
        assert_eq!(answer.allowed, warm.allowed, "the same review must get the same answer");
    }
    ((allocations() - before) / ROUNDS, warm)
}

#[test]
fn the_counter_counts_this_threads_allocations() {
    let before = allocations();
    let boxed = std::hint::black_box(Box::new([0u8; 64]));
    assert!(allocations() > before, "a Box must be counted");
    drop(boxed);
}

#[test]
fn mutate_010_allocations_per_review() {
    let (policies, namespaces) = (policies(), namespaces());
    // As the server answers it: change descriptions are written only for its debug log.
    let engine = Engine::new(&policies, &namespaces).with_change_descriptions(false);
    let (count, answer) = per_review(&engine, &fixture("010-mutate-create-pod-my-gpu-pod.json"), Phase::Mutate);
    let described = per_review(
        &engine.with_change_descriptions(true),
        &fixture("010-mutate-create-pod-my-gpu-pod.json"),
        Phase::Mutate,
    )
    .0;
    println!("/mutate 010: {count} allocations per review ({described} with change descriptions)");
    assert!(answer.allowed && answer.mutated, "pod 010 is admitted with a patch");
    assert!(
        count <= MUTATE_010_CEILING,
        "/mutate 010 made {count} allocations per review; ceiling {MUTATE_010_CEILING}"
    );
}

#[test]
fn validate_allocations_per_review() {
    let (policies, namespaces) = (policies(), namespaces());
    let engine = Engine::new(&policies, &namespaces);
    let mut over = Vec::new();
    for (name, ceiling) in VALIDATE_CEILINGS {
        let (count, answer) = per_review(&engine, &fixture(name), Phase::Validate);
        println!("/validate {name}: {count} allocations per review (ceiling {ceiling})");
        assert!(answer.allowed, "{name} passes validation: {:?}", answer.outcome.findings);
        if count > *ceiling {
            over.push(format!("{name}: {count} > {ceiling}"));
        }
    }
    assert!(over.is_empty(), "allocations per /validate review over the ceiling: {over:?}");
}

/// Ceilings: the counts measured when they were set, plus ~15 % (2026-11-27, 002's after a
/// template's preview stopped building and applying a JSON Patch: 247; after the server
/// stopped building what the policies leave unread, a Pod's volumes and last-applied copy:
/// 174 (181 with descriptions), 215, 298, 241; before, the rules'
/// `accelerators(...)` read the Pod view's parsed containers: 235 (242 with descriptions), 282,
/// 307, 317; after gang facts read labels in place, change descriptions are formatted only when
/// read and a Pod view parses its containers once: 239 (246), 307, 320, 331; after gang facts borrow
/// from the Pod 248, 325, 339, 345; after direct evaluation of CEL and the template fixes 251,
/// 333, 366, 358; before them 276, 1,156, 994, 968; see benches/README.md).
const MUTATE_010_CEILING: u64 = 200;
const VALIDATE_CEILINGS: &[(&str, u64)] = &[
    ("011-validate-create-pod-my-gpu-pod.json", 247),
    ("002-validate-create-job-mnist-demo.json", 284),
    ("019-validate-create-pod-gated-worker-0.json", 277),
];

/// What the Pod watch allocates per event (issue 18): every replica decodes every Pod of the
/// cluster at each restart and relist, and those short-lived allocations, interleaved with the
/// records that stay, are a restart's peak. The slim decoding (`cluster::WatchedPod`) must stay
/// well under a whole `Pod`'s: a field added to it shows up here.
#[test]
fn a_watched_pod_decodes_in_a_fraction_of_a_whole_pods_allocations() {
    use allot::control::cluster::WatchedPod;
    use k8s_openapi::api::core::v1::Pod;
    // A gated gang worker as the API server stores it: managedFields, status, conditions.
    let review: serde_json::Value =
        serde_json::from_slice(&fixture("020-mutate-update-pod-gated-worker-0.json")).unwrap();
    let pod = serde_json::to_vec(&review["request"]["oldObject"]).unwrap();
    let count = |decode: &dyn Fn()| {
        decode();
        let (before, bytes_before) = (allocations(), allocated_bytes());
        for _ in 0..ROUNDS {
            decode();
        }
        ((allocations() - before) / ROUNDS, (allocated_bytes() - bytes_before) / ROUNDS)
    };
    let (whole, whole_bytes) =
        count(&|| drop(std::hint::black_box(serde_json::from_slice::<Pod>(&pod).expect("a Pod"))));
    let (slim, slim_bytes) =
        count(&|| drop(std::hint::black_box(serde_json::from_slice::<WatchedPod>(&pod).expect("a watched Pod"))));
    println!(
        "watched pod 020 ({} bytes of JSON): {slim} allocations, {slim_bytes} bytes per decode; whole Pod {whole}, {whole_bytes} bytes",
        pod.len()
    );
    assert!(
        slim * 2 <= whole,
        "the slim decoding ({slim}) should make at most half a whole Pod's ({whole}) allocations"
    );
    assert!(slim <= WATCHED_POD_CEILING, "a watched pod made {slim} allocations; ceiling {WATCHED_POD_CEILING}");
}

/// The count measured when set (2026-11-26), plus ~15 %.
const WATCHED_POD_CEILING: u64 = 52;

/// What one gang's quota tally holds: the store keeps one for every gang and each deny-mode
/// ledger (and its copies) another. Measured as the bytes a copy of it allocates, for a gang of
/// 3 members asking GPUs, CPU, memory and a pod slot each.
#[test]
fn a_gangs_tally_holds_a_few_hundred_bytes() {
    use allot::model::quantity::Quantity;
    use allot::model::tally::GangTally;
    let requests = [
        ("cpu", Quantity::from_units(8)),
        ("memory", Quantity::from_units(64 << 30)),
        ("nvidia.com/gpu", Quantity::from_units(8)),
        ("pods", Quantity::from_units(1)),
    ];
    let mut tally = GangTally::default();
    for _ in 0..3 {
        tally.add(requests.iter().copied(), Some(4), false);
    }
    let (before, bytes_before) = (allocations(), allocated_bytes());
    let copy = std::hint::black_box(tally.clone());
    let (count, bytes) = (allocations() - before, allocated_bytes() - bytes_before);
    println!("a gang's tally (3 members, 4 resources): {count} allocations, {bytes} bytes per copy");
    assert_eq!(copy, tally);
    assert_eq!(copy.total().get("nvidia.com/gpu"), Some(&Quantity::from_units(32)), "3 members and a placeholder");
    assert!(bytes <= GANG_TALLY_CEILING, "a gang's tally copies {bytes} bytes; ceiling {GANG_TALLY_CEILING}");
}

/// The bytes measured when set (2026-12-07: 419 in 10 allocations; with maps instead of sorted
/// lists, before: 2,126 in 15), plus ~15 %.
const GANG_TALLY_CEILING: u64 = 480;

/// A copy of a team's ledger (what an admission round decides on) costs its pending charges,
/// not its folded counts: a deny-mode team with a thousand gangs waiting must not copy a
/// thousand gangs' tallies on every admission. A reconcile of the copy leaves the original as
/// it was (the folded counts are shared, never changed in place). Measured when written
/// (2026-12-07): 0 bytes; before the folded counts were shared, 1,410,420 bytes in 10,250
/// allocations.
#[test]
fn a_ledger_copy_shares_its_folded_gangs() {
    use allot::control::quota::ledger::{Ledger, SeenPod};
    use allot::model::quantity::Quantity;
    let gpus = |n: i64| [("nvidia.com/gpu".to_string(), Quantity::from_units(n))].into_iter().collect();
    let member = |gang: usize, m: usize| SeenPod {
        namespace: format!("team-{:02}", gang % 20),
        name: format!("gang-{gang}-{m}"),
        created: 1_000,
        finished: false,
        terminating: false,
        requests: gpus(1),
        gang: Some((format!("gang-{gang}"), Some(4))),
        claims: Default::default(),
    };
    let pods: Vec<SeenPod> = (0..1_000).flat_map(|g| (0..3).map(move |m| member(g, m))).collect();
    let mut ledger = Ledger::default();
    ledger.reconcile(&pods, 1_000);
    let usage = |l: &Ledger| l.usage().0.get("nvidia.com/gpu").map_or(0, |q| q.ceil_units());
    assert_eq!(usage(&ledger), 4_000, "3 members and a placeholder a gang");
    let (before, bytes_before) = (allocations(), allocated_bytes());
    let mut copy = std::hint::black_box(ledger.clone());
    let (count, bytes) = (allocations() - before, allocated_bytes() - bytes_before);
    println!("a copy of a ledger with 1,000 folded gangs: {count} allocations, {bytes} bytes");
    assert!(bytes <= 1_024, "a ledger copy allocated {bytes} bytes: it copies its folded gangs");
    copy.reconcile(&pods[..3], 1_001);
    assert_eq!((usage(&copy), usage(&ledger)), (4, 4_000), "the copy's reconcile changes only the copy");
}
