//! The reservation step over a real evaluation: a deny-mode team, a GPU pod, the engine with a
//! deferring book, then books that admit or refuse.

use std::sync::Mutex;

use serde_json::{Value, json};

use super::*;
use crate::admission::engine::Engine;
use crate::admission::{Phase, review};
use crate::model::namespaces::NoNamespaces;
use crate::model::policy::{PolicySet, Source, compile};

fn policies() -> PolicySet {
    let text = "apiVersion: allot.dev/v1alpha1\nkind: Team\nmetadata: {name: vision}\nspec:\n  \
                namespaces: {names: [vision]}\n  quota: {mode: Deny, limits: {nvidia.com/gpu: 4}}\n";
    compile(&[Source { name: "teams.yaml".into(), text: text.into() }]).expect("the team compiles")
}

fn pod_review(name: &str, gpus: u32) -> Vec<u8> {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "vision", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}}]},
    });
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": format!("review-{name}"), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": "vision", "name": name, "userInfo": {"username": "alice"}, "object": pod}});
    serde_json::to_vec(&review).expect("JSON")
}

/// Evaluates `body` at /validate with a deferring book, as the server does beside the ledger.
fn evaluated(policies: &PolicySet, body: &[u8]) -> Unreserved {
    let book = DeferringBook::default();
    let answer =
        review(body, Phase::Validate, &Engine::new(policies, &NoNamespaces).with_quota(&book)).expect("a review");
    Unreserved::new(answer, book)
}

/// A book that answers from a list, in order, and remembers what it was asked.
struct Scripted {
    answers: Mutex<Vec<Result<(), Refusal>>>,
    asked: Mutex<Vec<(String, String)>>,
}

impl Scripted {
    fn new(answers: Vec<Result<(), Refusal>>) -> Scripted {
        Scripted { answers: Mutex::new(answers), asked: Mutex::new(Vec::new()) }
    }
    fn asked(&self) -> Vec<(String, String)> {
        self.asked.lock().expect("lock").clone()
    }
}

impl Reservations for Scripted {
    async fn reserve(&self, _: &Quota, request: &QuotaRequest<'_>) -> Result<(), Refusal> {
        self.asked.lock().expect("lock").push((request.team.to_string(), request.pod.to_string()));
        let mut answers = self.answers.lock().expect("lock");
        if answers.is_empty() { Ok(()) } else { answers.remove(0) }
    }
}

fn response(answer: &Answer) -> Value {
    serde_json::from_slice::<Value>(&answer.body).expect("the body is JSON")["response"].clone()
}

fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().build().expect("a runtime").block_on(future)
}

#[test]
fn the_evaluation_defers_the_charge_and_an_admitting_book_keeps_the_answer() {
    let policies = policies();
    let unreserved = evaluated(&policies, &pod_review("p", 2));
    assert!(unreserved.has_charges(), "a deny-mode GPU pod leaves its charge to the reservation");
    assert_eq!(unreserved.charges[0].request.pod_uid, "uid-p");
    let book = Scripted::new(vec![]);
    let answer = block_on(unreserved.reserve(&book));
    assert_eq!(book.asked(), vec![("vision".to_string(), "p".to_string())]);
    assert!(answer.allowed);
    assert_eq!(response(&answer)["allowed"], json!(true));
}

#[test]
fn a_refusal_denies_with_the_team_quota_message_and_re_encodes_the_review() {
    let policies = policies();
    let unreserved = evaluated(&policies, &pod_review("p", 2));
    let refusal = Refusal::Unknown { reason: "usage is not known yet".into() };
    let answer = block_on(unreserved.reserve(&Scripted::new(vec![Err(refusal)])));
    assert!(!answer.allowed);
    let finding = answer.outcome.findings.last().expect("the denial");
    assert_eq!(finding.rule.to_string(), "team/quota");
    assert_eq!(finding.path, "spec");
    assert_eq!(finding.message, "team vision: usage is not known yet");
    let sent = response(&answer);
    assert_eq!((sent["allowed"].clone(), sent["uid"].clone()), (json!(false), json!("review-p")));
    assert!(sent["status"]["message"].as_str().expect("a message").contains("team vision: usage is not known yet"));
}

#[test]
fn after_a_refusal_the_later_charges_are_not_asked_for() {
    let policies = policies();
    let mut unreserved = evaluated(&policies, &pod_review("p", 1));
    let mut second = unreserved.charges[0].clone();
    second.request.pod = "second".into();
    unreserved.charges.push(second);
    let refusal = Refusal::GangFull { gang: "g".into(), declared: 1, existing: 1 };
    let book = Scripted::new(vec![Err(refusal)]);
    let answer = block_on(unreserved.reserve(&book));
    assert_eq!(book.asked().len(), 1, "the second charge is never reserved");
    assert!(!answer.allowed);
}

#[test]
fn nothing_is_deferred_without_a_deny_mode_quota() {
    let none = compile(&[]).expect("an empty policy set");
    let unreserved = evaluated(&none, &pod_review("p", 2));
    assert!(!unreserved.has_charges());
    assert!(unreserved.without_reserving().allowed);
}
