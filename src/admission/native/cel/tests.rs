use super::*;

fn pod() -> Bindings<'static> {
    static GPUS: std::sync::LazyLock<ResourceMatcher> =
        std::sync::LazyLock::new(|| ResourceMatcher::new(["nvidia.com/gpu", "nvidia.com/mig-*"]));
    Bindings { object: "object", old_object: Some("oldObject"), accelerators: &GPUS }
}

#[test]
fn rewrites_variables_but_not_fields_or_strings() {
    let out = rewrite("object.metadata.namespace == namespace && team != 'team' && workload.kind != \"x\"", pod());
    assert_eq!(
        out.as_deref(),
        Ok("object.metadata.namespace == variables.namespaceName && variables.team != 'team' && object.kind != \"x\"")
    );
    let t = Bindings { object: "allotPod", old_object: None, ..pod() };
    assert_eq!(rewrite("object.spec.x == 1.5", t).as_deref(), Ok("allotPod.spec.x == 1.5"));
    assert!(rewrite("oldObject == null", t).is_err(), "no oldObject for templates");
}

#[test]
fn helpers_and_shadowing_macro_variables_are_reported() {
    // A Pod's count and its spec's are expanded; other arguments and the map helpers are not.
    for counted in ["accelerators(object) == 0", "accelerators( object.spec ) > 8"] {
        let expanded = rewrite(counted, pod()).expect("expanded");
        assert!(expanded.contains("lists.range(") && !expanded.contains("accelerators("), "{expanded}");
    }
    let not_a_pod = rewrite("accelerators(object.metadata) == 0", pod()).unwrap_err();
    assert_eq!(not_a_pod, Unsupported::AcceleratorsArgument);
    assert!(not_a_pod.to_string().contains("accelerators"));
    let entry = rewrite("acceleratorRequests(object)['nvidia.com/gpu'] == 1", pod()).expect("one entry expands");
    assert!(entry.ends_with("['nvidia.com/gpu'] == 1") && !entry.contains("acceleratorRequests"), "{entry}");
    for whole_map in [
        "acceleratorRequests(object).size() == 1",
        "acceleratorRequests(object)[name] == 1",
        "acceleratorLimits(object)['nvidia.com/gpu'] == 1",
        "acceleratorRequests(object)['a\\'b'] == 1",
    ] {
        let err = rewrite(whole_map, pod()).unwrap_err();
        assert!(matches!(err, Unsupported::HelperLookup(_)) && err.to_string().contains("map"), "{whole_map}");
    }
    let reserved = rewrite("allotC == 1", pod()).unwrap_err();
    assert_eq!(reserved, Unsupported::ReservedName("allotC".into()));
    assert!(reserved.to_string().contains("reserved"));
    assert_eq!(
        rewrite("object.spec.containers.all(team, team.name != '')", pod()),
        Err(Unsupported::MacroVariable("team".into()))
    );
    // A container's count is expanded; a variable that is not only a container is not.
    let expanded = rewrite("object.spec.containers.all(c, accelerators(c) == 0)", pod()).expect("expanded");
    assert!(
        expanded.contains("c.resources.requests.filter(allotK,") && !expanded.contains("accelerators("),
        "{expanded}"
    );
    assert!(rewrite("object.spec.volumes.all(c, accelerators(c) == 0)", pod()).is_err());
    assert!(rewrite("object.spec.containers.all(c, accelerators(c) == 0) && x.all(c, true)", pod()).is_err());
    assert!(rewrite("object.spec.containers.all(c, accelerators(c) == 0)", pod()).is_ok());
    assert!(rewrite("object.spec.containers.all(c, c.name != 'team')", pod()).is_ok());
    assert!(rewrite("'unterminated", pod()).is_err());
}

proptest::proptest! {
    /// Any text, valid CEL or not: an answer (rewritten or refused), never a panic.
    #[test]
    fn rewriting_never_panics(source in "[a-z.()'\"\\\\ ,_é0-9]{0,48}") {
        let _ = rewrite(&source, pod());
    }
}

#[test]
fn globs_become_predicates() {
    assert_eq!(glob("vision", "n").as_deref(), Ok("n == \"vision\""));
    assert_eq!(glob("vision-*", "n").as_deref(), Ok("n.startsWith(\"vision-\")"));
    assert_eq!(glob("a?-*-b", "n").as_deref(), Ok("n.matches(\"^a.-.*-b$\")"));
    assert!(glob("team-{a,b}", "n").is_err());
}
