//! Arbitrary text as a policy file through `allot::policy::compile`: it must never panic, and a
//! set that compiles must evaluate the AdmissionReview fixtures without panicking either (so
//! fuzzed CEL expressions, globs, selectors and placements reach the engine).

#![no_main]

mod common;

use std::sync::OnceLock;

use allot::admission::{self, Phase};
use allot::engine::Engine;
use allot::namespaces::StaticNamespaces;
use allot::policy::{self, Source};
use libfuzzer_sys::fuzz_target;

struct Setup {
    reviews: Vec<(Phase, Vec<u8>)>,
    namespaces: StaticNamespaces,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

fn setup() -> &'static Setup {
    SETUP.get_or_init(|| Setup {
        reviews: common::fixture_reviews()
            .into_iter()
            .map(|(name, body)| (if name.contains("-validate-") { Phase::Validate } else { Phase::Mutate }, body))
            .collect(),
        namespaces: common::example_namespaces(),
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let setup = setup();
    let sources = [Source { name: "fuzz.yaml".to_string(), text: text.to_string() }];
    match policy::compile(&sources) {
        Ok(set) => {
            let engine = Engine::new(&set, &setup.namespaces);
            for (phase, body) in &setup.reviews {
                let answer = admission::review(body, *phase, &engine);
                assert!(answer.is_ok(), "a fixture review was rejected as malformed: {answer:?}");
            }
        }
        Err(errors) => {
            assert!(!errors.0.is_empty(), "compile failed without saying why");
            let _ = errors.to_string();
        }
    }
});
