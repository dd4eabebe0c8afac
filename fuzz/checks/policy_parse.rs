//! Arbitrary text as a policy file through `allot::model::policy::compile`: it must never panic, and a
//! set that compiles must evaluate the AdmissionReview fixtures without panicking either (so
//! fuzzed CEL expressions, globs, selectors and placements reach the engine).
//!
//! The fixtures are decoded once (`admission::decode`); each input runs only what depends on
//! it: compiling, and answering every fixture (`admission::answer`: the engine and the encoded
//! response). Decoding the 21 fixtures again for every input took about a quarter of the CPU
//! time of an input that compiles (fuzz/README.md, Results).

use super::common;

use std::sync::OnceLock;

use allot::admission::engine::Engine;
use allot::admission::{self, Phase};
use allot::model::namespaces::StaticNamespaces;
use allot::model::policy::{self, Source};

struct Setup {
    reviews: Vec<(Phase, admission::DecodedReview)>,
    namespaces: StaticNamespaces,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

fn setup() -> &'static Setup {
    SETUP.get_or_init(|| Setup {
        reviews: common::fixture_reviews()
            .into_iter()
            .map(|(name, body)| {
                let phase = if name.contains("-validate-") { Phase::Validate } else { Phase::Mutate };
                let decoded =
                    admission::decode(&body).unwrap_or_else(|e| panic!("fixture {name} does not decode: {e}"));
                (phase, decoded)
            })
            .collect(),
        namespaces: common::example_namespaces(),
    })
}

/// The target's check of one input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let setup = setup();
    let sources = [Source { name: "fuzz.yaml".to_string(), text: text.to_string() }];
    match policy::compile(&sources) {
        Ok(set) => {
            let engine = Engine::new(&set, &setup.namespaces);
            for (phase, review) in &setup.reviews {
                let answer = admission::answer(review, *phase, &engine);
                assert!(!answer.body.is_empty() && answer.uid == review.uid(), "bad answer: {answer:?}");
            }
        }
        Err(errors) => {
            assert!(!errors.0.is_empty(), "compile failed without saying why");
            let _ = errors.to_string();
        }
    }
}
