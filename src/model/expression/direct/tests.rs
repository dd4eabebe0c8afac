//! Direct evaluation against the interpreter: wherever direct evaluation answers, the
//! interpreter, on the bindings the engine makes, answers the same.

use std::borrow::Cow;
use std::sync::Arc;

use kube::core::cel::cel::Value as CelValue;
use kube::core::cel::cel::objects::{Key, Map};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::Val;
use crate::model::expression::{Environment, Expression, Inputs, Needs, json_to_cel, object_accelerators};
use crate::model::resources::{self, ResourceMatcher};
use crate::model::workload::PodView;

fn matcher() -> Arc<ResourceMatcher> {
    Arc::new(ResourceMatcher::new(resources::DEFAULT_ACCELERATORS))
}

/// The interpreter's representation of a direct result.
fn to_cel(value: &Val<'_>) -> CelValue {
    match value {
        Val::Null => CelValue::Null,
        Val::Bool(b) => CelValue::Bool(*b),
        Val::Int(i) => CelValue::Int(*i),
        Val::UInt(u) => CelValue::UInt(*u),
        Val::Double(d) => CelValue::Float(*d),
        Val::Str(s) => CelValue::String(Arc::new(s.to_string())),
        Val::List(items) => CelValue::List(Arc::new(items.iter().map(json_to_cel_nested).collect())),
        Val::Map(map) => json_to_cel_nested(map),
        Val::Root(map) => json_to_cel(map),
        Val::Metadata(map) => {
            let mut map = (*map).clone();
            if let Some(fields) = map.as_object_mut() {
                fields.remove("managedFields");
            }
            json_to_cel_nested(&map)
        }
        Val::Items(items) => CelValue::List(Arc::new(items.iter().map(to_cel).collect())),
    }
}

/// JSON below the top level (where `managedFields` is kept).
fn json_to_cel_nested(value: &Value) -> CelValue {
    match value {
        Value::Object(map) => CelValue::Map(Map {
            map: Arc::new(map.iter().map(|(k, v)| (Key::String(Arc::new(k.clone())), json_to_cel_nested(v))).collect()),
        }),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(json_to_cel_nested).collect())),
        other => json_to_cel(other),
    }
}

/// Evaluates `expression` both ways on `object`; true when direct evaluation answered.
/// Panics (fails the test) where the two disagree.
fn agree(env: &Environment, expression: &Expression, object: &Value, team: &str) -> bool {
    let needs: &Needs = expression.needs();
    let inputs = Inputs {
        needs: needs.clone(),
        object: Some(object),
        old_object: None,
        workload: Some(object),
        namespace: "vision",
        team,
        request: Some(
            json!({"operation": "CREATE", "dryRun": false, "userInfo": {"username": "alice", "groups": ["dev"]}}),
        ),
        object_accelerators: object_accelerators(object, None, &env.accelerators),
        view: None,
    };
    let direct = expression.evaluate_direct(&inputs.variables(), &env.accelerators, &"direct-test");
    // The same object as a Pod view: `accelerators(object)` from the view's requests and
    // `accelerators(c)` from its parsed containers must answer exactly as from the JSON.
    let view = PodView::new(String::new(), Cow::Borrowed(object));
    let from_view = Inputs {
        object_accelerators: object_accelerators(object, Some(&view), &env.accelerators),
        view: Some(&view),
        ..inputs.clone()
    };
    let direct_from_view = expression.evaluate_direct(&from_view.variables(), &env.accelerators, &"direct-test");
    assert_eq!(
        direct_from_view.as_ref().map(to_cel),
        direct.as_ref().map(to_cel),
        "`{}` on {:.300}: read through a Pod view",
        expression.source(),
        object.to_string()
    );
    let Some(direct) = direct else { return false };
    let scope = env.scope(&inputs.bindings());
    let interpreted = expression.execute(&scope, &"direct-test");
    assert_eq!(
        interpreted.as_ref().ok(),
        Some(&to_cel(&direct)),
        "`{}` on {:.300}: direct {direct:?}, interpreter {interpreted:?}",
        expression.source(),
        object.to_string()
    );
    true
}

/// Expressions exercising every compiled part, the places where the interpreter has rules of
/// its own, and the errors direct evaluation must give up on.
const EXPRESSIONS: &[&str] = &[
    "accelerators(object) == 0 || team != ''",
    "accelerators(object) > 1 && accelerators(object) <= 8",
    "object.spec.containers.all(c, accelerators(c) == 0 || !has(c.image) || c.image.contains('@sha256:') || \
     (c.image.substring(c.image.lastIndexOf('/') + 1).contains(':') && !c.image.endsWith(':latest')))",
    "!has(object.spec.priorityClassName) || object.spec.priorityClassName != 'high-priority'",
    "'high-priority pod requesting ' + string(accelerators(object)) + ' accelerator(s)'",
    "'namespace ' + namespace + ' belongs to no team; GPU workloads run in team namespaces'",
    "object.spec.containers.exists(c, c.name == 'main')",
    "object.spec.containers.exists_one(c, accelerators(c) > 0)",
    "object.spec.containers.all(c, c.image.startsWith('registry.local/'))",
    "object.spec.containers.map(c, c.name).size() > 0",
    "object.spec.containers.filter(c, accelerators(c) > 0).size() <= 1",
    "size(object.spec.containers) == 1",
    "object.spec.containers.size() >= 1",
    "object.metadata.name.size() < 20",
    "size(object.metadata.name) < 20",
    "size(object.metadata)",
    "size(object) > 0",
    "object.metadata.name.indexOf('-') >= 0",
    "object.metadata.name.lastIndexOf('-') == object.metadata.name.indexOf('-')",
    "object.metadata.name.indexOf('')",
    "object.metadata.name.substring(1, 3) == 'pu'",
    "object.metadata.name.substring(50)",
    "object.metadata.name.substring(2, 1)",
    "object.metadata.labels['allot.dev/gang-name'] == 'g'",
    "has(object.metadata.labels) && object.metadata.labels['allot.dev/tier'] == 'premium'",
    "'allot.dev/gang-name' in object.metadata.labels",
    "object.metadata.name in ['a', 'gpu-pod', object.metadata.namespace]",
    "object.metadata.name in [1, 'a']",
    "'x' in object.spec.containers",
    "object.spec.containers.all(c, !has(c.resources.limits) || !('nvidia.com/gpu' in c.resources.limits) || \
     int(c.resources.limits['nvidia.com/gpu']) <= 2)",
    "has(object.metadata.managedFields)",
    "object.metadata.managedFields.size() > 0",
    "object.metadata['managedFields']",
    "object.metadata.exists(k, k == 'managedFields')",
    "object.metadata",
    "object.spec.containers[0].name",
    "object.spec.containers[5].name",
    "object.spec.containers[-1].name",
    "object.spec.containers.name == false",
    "has(object.spec.containers.name)",
    "object.spec.priorityClassName.x == false",
    "object.spec.missing.deeper == 1",
    "has(object.status.phase)",
    "object.spec.nodeName == 'x'",
    "object.spec.priority == 1000",
    "object.spec.priority == 1000u",
    "object.spec.priority > 1.5",
    "object.spec.priority + 1 > object.spec.priority",
    "object.spec.priority - 1",
    "object.spec.priority == null",
    "object.spec.hostNetwork == true",
    "!has(object.spec.hostNetwork) || !object.spec.hostNetwork",
    "object.spec.terminationGracePeriodSeconds < 100",
    "object.spec.terminationGracePeriodSeconds + 9223372036854775807 > 0",
    "team == '' ? 'none' : team",
    "team ? 1 : 2",
    "team != '' && object.spec.containers.all(c, c.name != '')",
    "false && object.spec.missing == 1",
    "true || object.spec.missing == 1",
    "object.spec.missing == 1 || true",
    "object.spec.missing == 1 && false",
    "1 || true",
    "!object.metadata.name",
    "request.operation == 'CREATE' && request.userInfo.username != 'admin'",
    "request.userInfo.groups.exists(g, g == 'dev')",
    "'dev' in request.userInfo.groups",
    "workload.spec.containers.size() == object.spec.containers.size()",
    "accelerators(workload) == accelerators(object)",
    "accelerators(object.spec)",
    "accelerators(object.spec.containers[0]) == 1",
    "accelerators(object.metadata)",
    "accelerators(object.metadata.name)",
    "oldObject == null",
    "object.metadata.labels.exists(k, object.metadata.labels[k] == 'g')",
    "object.metadata.labels.all(k, k.startsWith('allot.dev/'))",
    "object.spec.containers.all(c, object.spec.containers.exists(d, d.name == c.name))",
    "[object].all(o, has(o.metadata.managedFields))",
    "object.spec.containers.all(object, has(object.name)) && object.spec.containers.size() == 2",
    "object.spec.containers.exists(c, object.spec.containers.all(c, c.name != '') && c.name == 'main')",
    "[[1, 2], [3]].all(l, l.exists(x, x > 2))",
    "[object.metadata.name, namespace, team].exists_one(s, s == 'vision')",
    "object.spec.containers.exists(c, c.image.endsWith(':latest')) ? 'latest' : 'pinned'",
    "[1, 2, 3].exists(x, x == 2)",
    "[1, 2, 3].all(x, x > 'a')",
    "['a', 'b'][1] == 'b'",
    "string(object.spec.priority) + 'x'",
    "string(1.5)",
    "string(true)",
    "int(object.spec.priority)",
    "int('12')",
    "object.metadata.name.contains('gpu') && object.metadata.name.endsWith('pod')",
    "object.metadata.annotations.note.contains('é')",
    "object.metadata.annotations.note.size()",
    "object.metadata.annotations.note.indexOf('n')",
    "object.metadata.annotations.note.substring(1)",
    "object.metadata.name < 'h' || object.metadata.name >= 'z'",
    "1.0 == 1.0 && 0.5 < 1.5",
    "1 < 1 || 1 > 1 || !(1 <= 1) || !(1 >= 1) || 2 <= 1 || 1 >= 2",
    "object.spec.containers.size() < 2",
    "object.spec.containers.size() <= 1",
    "object.spec.containers.size() > 2",
    "object.spec.containers.size() >= 2",
    "object.metadata.name > 'gpu-pod'",
    "object.metadata.name >= 'gpu-pod'",
    "-1 < 0u",
    "null == null",
    "true == true && true != false",
    "b'x' == b'x'",
    "{'a': 1}.a == 1",
    "object.metadata.name.matches('^gpu')",
    // `sets.contains` is kube-cel's set function even on a comprehension variable named `sets`.
    "[object.metadata.name].all(sets, !sets.contains('x'))",
    "object.spec.containers.all(math, math.name != '')",
];

fn pod(name: &str, image: &str, gpus: &str, priority: Value, note: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "vision", "labels": labels,
                     "annotations": {"note": note},
                     "managedFields": [{"manager": "kubectl"}]},
        "spec": {
            "priority": priority,
            "terminationGracePeriodSeconds": 30,
            "containers": [
                {"name": "main", "image": image,
                 "resources": {"limits": {"nvidia.com/gpu": gpus}}},
                {"name": "side", "image": "busybox"}
            ]
        }
    })
}

/// The Pods of the captured admission reviews, and a few hand-made ones.
fn objects() -> Vec<Value> {
    let mut out: Vec<Value> = crate::model::fixtures::reviews()
        .into_iter()
        .filter_map(|(_, review)| review.pointer("/request/object").filter(|o| o.is_object()).cloned())
        .collect();
    assert!(out.len() >= 10, "the captured reviews were not read: {} objects", out.len());
    out.push(pod(
        "gpu-pod",
        "nvcr.io/nvidia/pytorch:24.01",
        "2",
        json!(1000),
        "über",
        json!({"allot.dev/gang-name": "g"}),
    ));
    out.push(pod("a", "registry:5000/train", "1", json!(null), "n", json!({})));
    out.push(pod("z-é", "img@sha256:abc", "500m", json!(9223372036854775807u64), "", json!({"x": "y"})));
    out.push(pod("gpu-pod", "x:latest", "1", json!(18446744073709551615u64), "note", json!(null)));
    out.push(json!({"metadata": {"name": "bare"}, "spec": {"containers": [{}]}}));
    out.push(json!({"spec": {"containers": "not a list", "priority": 2.5}}));
    out
}

#[test]
fn direct_evaluation_agrees_with_the_interpreter() {
    let env = Environment::new(matcher());
    let objects = objects();
    let mut answered = 0usize;
    let mut compiled = 0usize;
    for source in EXPRESSIONS {
        let expression = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
        compiled += usize::from(expression.is_direct());
        for object in &objects {
            for team in ["", "vision"] {
                answered += usize::from(agree(&env, &expression, object, team));
            }
        }
    }
    // Not vacuous: most expressions compile, and most evaluations are answered directly.
    assert!(compiled * 10 >= EXPRESSIONS.len() * 8, "{compiled} of {} compiled", EXPRESSIONS.len());
    let total = EXPRESSIONS.len() * objects.len() * 2;
    assert!(answered * 5 >= total * 2, "{answered} of {total} answered directly");
}

/// Direct evaluation counts comprehension steps as the budget does (each loop condition, the one
/// that stops `all`/`exists` early included), so it gives up wherever the interpreter would stop
/// at the budget.
#[test]
fn comprehension_steps_are_counted_as_the_budget_counts_them() {
    let env = Environment::new(matcher());
    let object = json!({"a": [0, 0, 0, 0], "b": [1, 2, 3], "m": {"x": "1", "y": "2"}, "e": []});
    for source in [
        "object.a.all(x, object.b.exists(y, true))",
        "object.b.exists(y, y == 2)",
        "object.b.exists(y, y == 7)",
        "object.b.all(y, y < 2)",
        "object.b.exists_one(y, y > 1)",
        "object.a.all(x, object.b.all(y, object.b.exists(z, z == y)))",
        "object.m.all(k, k != '')",
        "object.e.all(x, false)",
        "[1, 2].exists(x, [3, 4].all(y, y > x))",
    ] {
        let expression = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
        let direct = expression.direct.as_ref().unwrap_or_else(|| panic!("{source} compiles for direct evaluation"));
        let variables = super::Variables { object: Some(&object), ..super::Variables::default() };
        let (value, counted) = direct.evaluate_counting(&variables, &env.accelerators);
        assert!(value.is_ok(), "{source}: {value:?}");
        let inputs = Inputs { needs: expression.needs().clone(), object: Some(&object), ..Inputs::default() };
        let scope = env.scope(&inputs.bindings());
        expression.execute(&scope, &"direct-steps").unwrap_or_else(|e| panic!("{source}: {e}"));
        assert_eq!(counted, crate::model::expression::budget::iterations_spent(), "{source}");
    }
}

/// A generated container: images and names with and without tags, digests, registries with
/// ports, non-ASCII text; quantities whole, fractional, huge and malformed.
fn container() -> impl Strategy<Value = Value> {
    let image = prop_oneof![
        Just("busybox".to_string()),
        Just("busybox:latest".to_string()),
        Just("registry:5000/train".to_string()),
        Just("registry:5000/train:v1".to_string()),
        Just("img@sha256:0123".to_string()),
        Just("ünïcode/ïmage:tag".to_string()),
        "[a-z:/@.é]{0,12}",
    ];
    let quantity = prop_oneof![
        Just(json!("1")),
        Just(json!("500m")),
        Just(json!("9223372036854775807")),
        Just(json!(2)),
        Just(json!("x")),
        Just(json!(null)),
    ];
    (image, proptest::option::of(quantity), proptest::option::of("[a-z]{0,6}"), any::<bool>()).prop_map(
        |(image, gpus, name, has_image)| {
            let mut c = json!({});
            if has_image {
                c["image"] = json!(image);
            }
            if let Some(name) = name {
                c["name"] = json!(name);
            }
            if let Some(gpus) = gpus {
                c["resources"] = json!({"limits": {"nvidia.com/gpu": gpus}, "requests": {"cpu": "1"}});
            }
            c
        },
    )
}

fn generated_pod() -> impl Strategy<Value = Value> {
    let priority =
        prop_oneof![Just(json!(null)), any::<i64>().prop_map(|i| json!(i)), Just(json!(1.5)), Just(json!("high"))];
    let class = prop_oneof![Just(json!("high-priority")), Just(json!("low")), Just(json!(7)), Just(json!(null))];
    (
        proptest::collection::vec(container(), 0..4),
        priority,
        proptest::option::of(class),
        "[a-zé-]{0,10}",
        any::<bool>(),
    )
        .prop_map(|(containers, priority, class, name, managed)| {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"allot.dev/gang-name": "g"}, "annotations": {"note": name}},
                "spec": {"containers": containers, "priority": priority}});
            if let Some(class) = class {
                pod["spec"]["priorityClassName"] = class;
            }
            if managed {
                pod["metadata"]["managedFields"] = json!([{"manager": "m"}]);
            }
            pod
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn generated_pods_get_the_interpreters_answers(pod in generated_pod()) {
        let env = Environment::new(matcher());
        for source in EXPRESSIONS {
            let expression = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
            agree(&env, &expression, &pod, "vision");
        }
    }
}

/// Random expressions over the compiled parts (typed loosely, so many are ill-typed and must give
/// up), drawn from a seed: a grammar-based differential fuzz of direct evaluation.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn pick<'s>(&mut self, options: &[&'s str]) -> &'s str {
        options[(self.next() % options.len() as u64) as usize]
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn boolean(&mut self, depth: u32, local: Option<&str>) -> String {
        if depth == 0 {
            return self
                .pick(&["true", "false", "has(object.spec.priorityClassName)", "has(object.metadata.managedFields)"])
                .into();
        }
        let d = depth - 1;
        match self.below(14) {
            0 => format!("!{}", self.boolean(d, local)),
            1 => format!("({} && {})", self.boolean(d, local), self.boolean(d, local)),
            2 => format!("({} || {})", self.boolean(d, local), self.boolean(d, local)),
            3 => format!("({} ? {} : {})", self.boolean(d, local), self.boolean(d, local), self.boolean(d, local)),
            4 => format!(
                "{} {} {}",
                self.int(d, local),
                self.pick(&["==", "!=", "<", "<=", ">", ">="]),
                self.int(d, local)
            ),
            5 => format!("{} {} {}", self.string(d, local), self.pick(&["==", "!=", "<", ">="]), self.string(d, local)),
            6 => format!(
                "{}.{}({})",
                self.string(d, local),
                self.pick(&["startsWith", "endsWith", "contains"]),
                self.string(d, local)
            ),
            7 => format!("{} in {}", self.string(d, local), self.list(d, local)),
            8 => {
                let var = self.pick(&["c", "x", "object"]);
                format!(
                    "{}.{}({var}, {})",
                    self.list(d, local),
                    self.pick(&["all", "exists", "exists_one"]),
                    self.boolean(d, Some(var))
                )
            }
            9 => format!("{} == {}", self.any(d, local), self.any(d, local)),
            10 => format!(
                "has({}.{})",
                self.map(d, local),
                self.pick(&["name", "image", "resources", "metadata", "spec", "managedFields"])
            ),
            11 => format!("{} == null", self.any(d, local)),
            12 => local.map_or_else(
                || "team != ''".into(),
                |v| format!("{v}.{} == {}", self.pick(&["name", "image"]), self.string(d, None)),
            ),
            _ => self.pick(&["object.spec.hostNetwork", "object.metadata.labels['allot.dev/gang-name'] == 'g'"]).into(),
        }
    }

    fn int(&mut self, depth: u32, local: Option<&str>) -> String {
        if depth == 0 {
            return self
                .pick(&[
                    "0",
                    "1",
                    "2",
                    "-1",
                    "9223372036854775807",
                    "1u",
                    "1.5",
                    "accelerators(object)",
                    "object.spec.priority",
                ])
                .into();
        }
        let d = depth - 1;
        match self.below(9) {
            0 => format!("size({})", self.string(d, local)),
            1 => format!("{}.size()", self.list(d, local)),
            2 => format!("({} {} {})", self.int(d, local), self.pick(&["+", "-"]), self.int(d, local)),
            3 => format!(
                "{}.{}({})",
                self.string(d, local),
                self.pick(&["indexOf", "lastIndexOf"]),
                self.string(d, local)
            ),
            4 => format!("int({})", self.any(d, local)),
            5 => format!("({} ? {} : {})", self.boolean(d, local), self.int(d, local), self.int(d, local)),
            6 => format!("accelerators({})", self.map(d, local)),
            7 => format!("{}[{}]", self.list(d, local), self.pick(&["0", "1", "-1", "5"])),
            _ => self.int(0, local),
        }
    }

    fn string(&mut self, depth: u32, local: Option<&str>) -> String {
        if depth == 0 {
            return self
                .pick(&["''", "'a'", "'gpu'", "'-'", "'é'", "':latest'", "object.metadata.name", "namespace", "team"])
                .into();
        }
        let d = depth - 1;
        match self.below(7) {
            0 => format!("({} + {})", self.string(d, local), self.string(d, local)),
            1 => format!("string({})", self.any(d, local)),
            2 => format!("{}.substring({})", self.string(d, local), self.int(d, local)),
            3 => format!("{}.substring({}, {})", self.string(d, local), self.int(d, local), self.int(d, local)),
            4 => format!("object.metadata.labels[{}]", self.string(d, local)),
            5 => local.map_or_else(|| "object.metadata.annotations.note".into(), |v| format!("{v}.name")),
            _ => self.string(0, local),
        }
    }

    fn list(&mut self, depth: u32, local: Option<&str>) -> String {
        let d = depth.saturating_sub(1);
        match self.below(6) {
            0 => "object.spec.containers".into(),
            1 => "object.metadata.labels".into(),
            2 => format!("[{}, {}]", self.string(d, local), self.string(d, local)),
            3 => format!("[{}, {}]", self.int(d, local), self.any(d, local)),
            4 => "object.metadata".into(),
            _ => "[object]".into(),
        }
    }

    fn map(&mut self, depth: u32, local: Option<&str>) -> String {
        match (self.below(5), local) {
            (0, Some(v)) => v.into(),
            (1, _) => "object.spec".into(),
            (2, _) => "object.metadata".into(),
            (3, _) => format!("object.spec.containers[{}]", self.below(3)),
            _ => {
                if depth > 0 {
                    "object".into()
                } else {
                    "workload".into()
                }
            }
        }
    }

    fn any(&mut self, depth: u32, local: Option<&str>) -> String {
        match self.below(5) {
            0 => self.boolean(depth, local),
            1 => self.int(depth, local),
            2 => self.string(depth, local),
            3 => self.list(depth, local),
            _ => self.map(depth, local),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_expressions_get_the_interpreters_answers(seed in any::<u64>(), pod in generated_pod()) {
        let env = Environment::new(matcher());
        let mut draw = Draw(seed | 1);
        let source = draw.boolean(3, None);
        if let Ok(expression) = Expression::compile(&source) {
            for team in ["", "vision"] {
                agree(&env, &expression, &pod, team);
            }
        }
    }
}

/// The same grammar over fixed seeds, with the share answered directly asserted (not vacuous).
#[test]
fn random_expressions_are_answered_as_the_interpreter_answers() {
    let env = Environment::new(matcher());
    let pods = [
        pod("gpu-pod", "x:latest", "1", json!(5), "note", json!({"allot.dev/gang-name": "g"})),
        pod("z-é", "img@sha256:abc", "500m", json!(9223372036854775807u64), "", json!({"x": "y"})),
    ];
    let (mut compiled, mut answered) = (0usize, 0usize);
    for seed in 1..1500u64 {
        let source = Draw(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).boolean(3, None);
        let Ok(expression) = Expression::compile(&source) else { continue };
        compiled += 1;
        for pod in &pods {
            answered += usize::from(agree(&env, &expression, pod, "vision"));
        }
    }
    assert!(compiled > 1000, "only {compiled} of 1,499 random expressions compiled");
    assert!(answered * 5 >= compiled * 2, "{answered} of {} evaluations answered directly", compiled * 2);
}
