use super::*;
use crate::model::resources;
use serde_json::json;

fn env() -> Environment {
    Environment::new(Arc::new(ResourceMatcher::new(resources::DEFAULT_ACCELERATORS)))
}

fn bindings(object: Value) -> Bindings {
    Bindings {
        vars: u8::MAX,
        object: json_to_cel(&object),
        old_object: CelValue::Null,
        workload: json_to_cel(&object),
        namespace: "vision".into(),
        team: "vision".into(),
        request: json_to_cel(&json!({"operation": "CREATE", "dryRun": false})),
        object_accelerators: None,
    }
}

fn eval(source: &str, object: Value) -> Result<bool, String> {
    let env = env();
    let b = bindings(object);
    Expression::compile(source)
        .map_err(|e| e.to_string())?
        .eval_bool(&env.scope(&b), &"test")
        .map_err(|e| e.to_string())
}

fn gpu_pod(n: u32) -> Value {
    json!({"metadata": {"labels": {"allot.dev/gang-name": "g"}, "managedFields": [{"x": 1}]},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": n.to_string()}}}]}})
}

#[test]
fn keys_with_dots_and_slashes_are_read_as_written() {
    // The pitfall DESIGN.md warns about: this must evaluate, and evaluate to false for 4.
    let rule = "object.spec.containers.all(c, !has(c.resources.limits) || !('nvidia.com/gpu' in c.resources.limits) || int(c.resources.limits['nvidia.com/gpu']) <= 2)";
    assert_eq!(eval(rule, gpu_pod(1)), Ok(true));
    assert_eq!(eval(rule, gpu_pod(4)), Ok(false));
    assert_eq!(eval("object.metadata.labels['allot.dev/gang-name'] == 'g'", gpu_pod(1)), Ok(true));
}

#[test]
fn accelerator_helpers() {
    assert_eq!(eval("accelerators(object) == 3", gpu_pod(3)), Ok(true));
    assert_eq!(eval("accelerators(object.spec.containers[0]) == 3", gpu_pod(3)), Ok(true));
    assert_eq!(eval("acceleratorRequests(object)['nvidia.com/gpu'] == 2", gpu_pod(2)), Ok(true));
    assert_eq!(eval("acceleratorLimits(object.spec.containers[0])['nvidia.com/gpu'] == 2", gpu_pod(2)), Ok(true));
    assert_eq!(eval("accelerators(object) == 0", json!({"spec": {"containers": [{}]}})), Ok(true));
}

#[test]
fn kubernetes_libraries_are_available() {
    assert_eq!(eval("quantity('1Gi').isGreaterThan(quantity('1Mi'))", json!({})), Ok(true));
    assert_eq!(eval("'a-b'.split('-').size() == 2", json!({})), Ok(true));
}

#[test]
fn evaluation_errors_are_counted_per_rule_and_answers_are_not() {
    let env = env();
    let b = bindings(gpu_pod(1));
    let count = |owner: &str| RULE_ERRORS.get_or_create(&RuleLabels { rule: owner.into() }).get();
    let missing = Expression::compile("object.metadata.labels['absent'] == 'x'").unwrap();
    assert!(missing.eval_bool(&env.scope(&b), &"errors-missing-key").is_err());
    assert!(missing.eval_bool(&env.scope(&b), &"errors-missing-key").is_err());
    assert_eq!(count("errors-missing-key"), 2);
    let not_bool = Expression::compile("object.metadata.labels").unwrap();
    assert!(not_bool.eval_bool(&env.scope(&b), &"errors-not-bool").is_err());
    assert_eq!(count("errors-not-bool"), 1);
    // true and false are answers, not errors.
    let fine = Expression::compile("accelerators(object) == 1").unwrap();
    assert_eq!(fine.eval_bool(&env.scope(&b), &"errors-none"), Ok(true));
    assert_eq!(count("errors-none"), 0);
}

#[test]
fn managed_fields_are_not_bound() {
    assert_eq!(eval("!has(object.metadata.managedFields)", gpu_pod(1)), Ok(true));
}

#[test]
fn compile_errors_are_clear() {
    let err = Expression::compile("object.spec.(").unwrap_err();
    assert!(matches!(err, ExpressionError::Syntax(_)) && err.to_string().contains("syntax"), "{err}");
    let err = Expression::compile("objet.spec.containers.size() > 0").unwrap_err();
    assert_eq!(err, ExpressionError::UnknownVariables(vec!["objet".into()]));
    let err = err.to_string();
    assert!(err.contains("objet"), "{err}");
    // Comprehension variables are bound only inside their macro.
    assert!(Expression::compile("object.spec.containers.all(c, c.name != '')").is_ok());
    assert!(Expression::compile("object.spec.containers.exists(c, true) && c.name == ''").is_err());
    // Type names are not unknown variables; but `type()` itself is not in cel 0.13's
    // environment (it fails on every evaluation), so the load-time check now refuses it.
    let err = Expression::compile("type(object) == map").unwrap_err();
    assert_eq!(err.metric_label(), "unsupported");
    let err = err.to_string();
    assert!(err.contains("unknown function type()") && !err.contains("variable"), "{err}");
    let program = Program::compile("type(object) == map").unwrap();
    let root = Context::default();
    assert!(matches!(program.execute(&root), Err(ExecutionError::UndeclaredReference(_))));
}

/// Bindings of `object` cut to what `source` reads, as the engine binds them.
fn projected(source: &str, object: &Value) -> Bindings {
    let expression = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
    let needs = expression.needs();
    let matcher = ResourceMatcher::new(resources::DEFAULT_ACCELERATORS);
    Bindings {
        vars: needs.vars,
        object: json_to_cel_projected(object, &needs.object),
        workload: json_to_cel_projected(object, &needs.workload),
        object_accelerators: object_accelerators(object, None, &matcher),
        ..bindings(object.clone())
    }
}

#[test]
fn select_chains_bind_only_the_fields_they_reach() {
    let e = Expression::compile("object.spec.containers.size() > 0 && has(object.spec.priorityClassName)").unwrap();
    let needs = e.needs();
    assert!(!needs.object.is_whole());
    assert_eq!(needs.object.fields.keys().collect::<Vec<_>>(), ["spec"]);
    let spec = &needs.object.fields["spec"];
    assert_eq!(spec.fields.keys().collect::<Vec<_>>(), ["containers", "priorityClassName"]);
    assert!(spec.fields.values().all(Projection::is_whole));
    // Any other use of the variable reads it whole: an index, an argument, a comparison.
    for source in ["object['spec'] != null", "size(object) > 0", "object == {}", "object.exists(k, k == 'spec')"] {
        assert!(Expression::compile(source).unwrap().needs().object.is_whole(), "{source}");
    }
    // A comprehension variable named like a policy variable is not that variable.
    let e = Expression::compile("[{'a': 1}].all(object, object.a == 1) && team == ''").unwrap();
    assert_eq!(e.vars(), var_bit("team"));
    // accelerators(object) is computed before evaluation: the object is not bound for it.
    let e = Expression::compile("accelerators(object) == 0 || team != ''").unwrap();
    assert_eq!(e.vars(), OBJECT_ACCELERATORS_BIT | var_bit("team"));
}

#[test]
fn projected_bindings_evaluate_like_whole_ones() {
    let mut pod = gpu_pod(3);
    pod["spec"]["priorityClassName"] = json!("high-priority");
    pod["spec"]["initContainers"] = json!([{"name": "i", "resources": {"requests": {"nvidia.com/gpu": "5"}}}]);
    pod["metadata"]["annotations"] = json!({"a": "b"});
    let sources = [
        "accelerators(object) == 5",
        "accelerators(object) == 0 || team != ''",
        "object.spec.containers.all(c, accelerators(c) == 0 || c.name == 'c')",
        "has(object.spec.priorityClassName) && object.spec.priorityClassName == 'high-priority'",
        "!has(object.spec.nodeName)",
        "object.spec.nodeName == 'x'",
        "object.metadata.labels['allot.dev/gang-name'] == 'g'",
        "object.metadata.annotations.a == 'b' && !has(object.metadata.managedFields)",
        "object.spec.containers[0].resources.limits['nvidia.com/gpu'] == '3'",
        "workload.spec.containers.size() == 1 && accelerators(workload) == 5",
        "[{'spec': {'containers': [{'resources': {'limits': {'nvidia.com/gpu': '2'}}}]}}].all(object, accelerators(object) == 2)",
        "object.status.phase == 'Pending'",
        "object.spec.containers.exists(c, c.missing == 1)",
        // A missing key at any depth, a select or has() on a list, a string or null.
        "has(object.status.phase)",
        "object.spec.missing.deeper == 1",
        "has(object.spec.containers.name)",
        "object.spec.containers.name == false",
        "object.spec.priorityClassName.x == false && has(object.spec.priorityClassName.x) == false",
        "object.metadata.nullField.x == false && !has(object.metadata.nullField.x)",
        "object.spec.containers.all(object, has(object.name)) && object.spec.containers.size() == 1",
        "'p-' + object.spec.priorityClassName in ['p-high-priority'] && object.spec.nodeName == 'x'",
        "object.spec.containers.exists(c, c.name == object.spec.containers[0].name)",
    ];
    pod["metadata"]["nullField"] = Value::Null;
    let env = env();
    for source in sources {
        let e = Expression::compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
        let whole = e.eval_bool(&env.scope(&bindings(pod.clone())), &"whole");
        let cut = e.eval_bool(&env.scope(&projected(source, &pod)), &"projected");
        // The same answer, and the same error where there is one.
        assert_eq!(whole, cut, "{source}");
    }
    assert_eq!(eval("accelerators(object) == 5", pod.clone()), Ok(true));
}

#[test]
fn linear_expressions_are_recognised() {
    let linear = |source: &str| Expression::compile(source).unwrap_or_else(|e| panic!("{e}")).is_linear();
    for source in [
        "accelerators(object) == 0 || team != ''",
        "object.spec.containers.all(c, accelerators(c) == 0 || c.image.contains('@sha256:') || \
         (c.image.substring(c.image.lastIndexOf('/') + 1).contains(':') && !c.image.endsWith(':latest')))",
        "!has(object.spec.priorityClassName) || object.spec.priorityClassName != 'high-priority'",
        "'high-priority pod requesting ' + string(accelerators(object)) + ' accelerator(s)'",
        // A walk over each element's own part: linear in the object together.
        "object.spec.containers.all(c, !has(c.env) || c.env.all(e, e.name != 'NVIDIA_VISIBLE_DEVICES'))",
        "object.spec.containers.all(c, c.ports.all(p, p.containerPort > 0))",
    ] {
        assert!(linear(source), "{source}");
    }
    // The shipped nested walk is also evaluated directly over the JSON (not by the
    // interpreter, which converts every bound object first).
    let nested = "object.spec.containers.all(c, !has(c.env) || accelerators(c) > 0 || \
                  c.env.all(e, e.name != 'NVIDIA_VISIBLE_DEVICES' || (has(e.value) && e.value in ['void', 'none'])))";
    assert!(Expression::compile(nested).is_ok_and(|e| e.is_direct() && e.is_linear()));
    for source in [
        // Nested: quadratic in the list.
        "object.spec.containers.all(c, object.spec.containers.all(d, c.name == d.name))",
        // Two parts of one element walked one inside the other, or a part of something
        // other than the innermost element.
        "object.spec.containers.all(c, c.env.all(e, c.ports.all(p, e.name != p.name)))",
        "object.spec.containers.all(c, c.env.all(e, c.env.all(f, e.name != f.name)))",
        // map/filter copy their accumulated list on every step.
        "object.spec.containers.map(c, c.name).size() > 0",
        "object.spec.containers.filter(c, c.name == 'x').size() == 0",
        // A regular expression, or a function of unknown cost.
        "object.metadata.name.matches('^a+$')",
        "object.metadata.name.split('-').size() > 0",
    ] {
        assert!(!linear(source), "{source}");
    }
}

#[test]
fn accelerator_totals_that_overflow_are_errors_not_panics() {
    let huge = json!({"spec": {"containers": [{"resources": {"limits": {
        "nvidia.com/gpu": "9223372036854775807", "nvidia.com/mig-1g.10gb": "9223372036854775807"}}}]}});
    let matcher = ResourceMatcher::new(resources::DEFAULT_ACCELERATORS);
    assert_eq!(object_accelerators(&huge, None, &matcher), None);
    assert!(eval("accelerators(object) > 0", huge.clone()).is_err());
    assert!(eval("accelerators(object.spec.containers[0]) > 0", huge).is_err());
}

#[test]
fn non_bool_results_are_errors() {
    assert!(eval("1 + 1", json!({})).is_err());
    assert!(eval("object.spec.missing.field", json!({"spec": {}})).is_err());
}

#[test]
fn refusals_before_parsing_have_their_variant() {
    let deep = format!("{}1{}", "(".repeat(depth::MAX_NESTING + 1), ")".repeat(depth::MAX_NESTING + 1));
    let err = Expression::compile(&deep).unwrap_err();
    assert_eq!(err.metric_label(), "too_nested");
    assert!(err.to_string().starts_with("the expression nests"), "{err}");
    let err = ForeignExpression::compile("!!true").unwrap_err();
    assert_eq!(err, ExpressionError::RepeatedUnary { operator: '!', column: 1 });
    assert!(err.to_string().starts_with("`!` twice in a row (column 1)"), "{err}");
}
