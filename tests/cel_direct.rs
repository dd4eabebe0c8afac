//! The shipped policies under direct evaluation (`allot::model::expression::direct`): every expression
//! is compiled for it, answers every captured Pod without the interpreter, and answers what the
//! interpreter answers. (The differential test over generated objects and the interpreter's
//! quirks is `expression::direct::tests`, inside the crate.)

use std::path::Path;

use allot::model::expression::direct::Val;
use allot::model::expression::{Expression, Inputs, object_accelerators};
use serde_json::{Value, json};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Pods of the captured admission reviews.
fn captured_pods() -> Vec<Value> {
    let dir = repo().join("tests/fixtures/admission-reviews");
    let pods: Vec<Value> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .filter_map(|entry| {
            let review: Value = serde_json::from_slice(&std::fs::read(entry.ok()?.path()).ok()?).ok()?;
            review.pointer("/request/object").filter(|o| o["kind"] == "Pod").cloned()
        })
        .collect();
    assert!(pods.len() >= 5, "too few captured Pods under {}", dir.display());
    pods
}

#[test]
fn every_shipped_expression_is_answered_directly_as_the_interpreter_answers() {
    let policies = allot::model::policy::load_dir(&repo().join("policies")).expect("the shipped policies load");
    let expressions: Vec<&Expression> = policies
        .rules
        .iter()
        .flat_map(|r| std::iter::once(&r.expression).chain(r.message_expression.as_ref()))
        .chain(policies.placements.iter().filter_map(|p| p.when.as_ref()))
        .collect();
    assert!(expressions.len() >= 4, "the shipped policies hold Rules with expressions");
    let request = json!({"operation": "CREATE", "dryRun": false, "userInfo": {"username": "alice", "groups": []}});
    for pod in captured_pods() {
        for expression in &expressions {
            assert!(expression.is_direct(), "`{}` is not compiled for direct evaluation", expression.source());
            for team in ["", "vision"] {
                let inputs = Inputs {
                    needs: expression.needs().clone(),
                    object: Some(&pod),
                    workload: Some(&pod),
                    namespace: "vision",
                    team,
                    request: Some(request.clone()),
                    object_accelerators: object_accelerators(&pod, None, &policies.accelerators),
                    ..Inputs::default()
                };
                let direct = expression.evaluate_direct(&inputs.variables(), &policies.accelerators, &"cel-direct");
                let scope = policies.env.scope(&inputs.bindings());
                let name = &pod["metadata"]["name"];
                match direct {
                    Some(Val::Bool(b)) => {
                        assert_eq!(
                            expression.eval_bool(&scope, &"cel-direct"),
                            Ok(b),
                            "`{}` on {name}",
                            expression.source()
                        )
                    }
                    Some(Val::Str(s)) => assert_eq!(
                        expression.eval_string(&scope, &"cel-direct").as_deref(),
                        Ok(s.as_ref()),
                        "`{}` on {name}",
                        expression.source()
                    ),
                    other => panic!("`{}` on {name}: direct evaluation gave {other:?}", expression.source()),
                }
            }
        }
    }
}
