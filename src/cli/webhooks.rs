//! `allot webhooks`: the MutatingWebhookConfiguration and ValidatingWebhookConfiguration to
//! apply, rendered from the same workload table the engine uses (so every kind Allot can check
//! is registered, and nothing else).
//!
//! Blast radius: a namespaceSelector leaves `kube-system` and Allot's own namespace alone;
//! matchConditions skip the kubelet (mirror pods cannot be mutated) and Allot's own service
//! account (its controller's gate removals must never depend on its webhook).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};

use crate::model::workload::WORKLOAD_KINDS;

/// Where the API server reaches Allot.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// An in-cluster Service (`namespace`, `name`, port 443).
    Service { namespace: String, name: String },
    /// A URL (`https://host:port`), for Allot outside the cluster.
    Url(String),
}

/// Options of `allot webhooks`.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    pub endpoint: Endpoint,
    pub ca_bundle: Vec<u8>,
    /// Name of the two configurations.
    pub name: String,
    /// `Fail` or `Ignore`.
    pub failure_policy: String,
    pub timeout_seconds: i32,
    /// Namespaces never sent to Allot (besides kube-system).
    pub exclude_namespaces: Vec<String>,
    /// Allot's own service account user name, skipped by matchConditions.
    pub service_account: Option<String>,
    /// `--native-covers`: the fingerprint ([`crate::admission::covers::fingerprint`]) of the native
    /// policies installed beside the webhooks. The webhook paths carry it, so Allot leaves out
    /// what those policies do only while its own policy set compiles to the same objects.
    pub native_fingerprint: Option<String>,
}

/// The path of a phase's webhook (`/mutate`, `/validate`), or its `--native-covers` form.
fn phase_path(opts: &WebhookOptions, phase: &str) -> String {
    match &opts.native_fingerprint {
        Some(fingerprint) => format!("/{phase}/native/{fingerprint}"),
        None => format!("/{phase}"),
    }
}

fn client_config(opts: &WebhookOptions, path: &str) -> WebhookClientConfig {
    let ca_bundle = Some(ByteString(opts.ca_bundle.clone()));
    match &opts.endpoint {
        Endpoint::Service { namespace, name } => WebhookClientConfig {
            ca_bundle,
            service: Some(ServiceReference {
                namespace: namespace.clone(),
                name: name.clone(),
                path: Some(path.to_string()),
                port: Some(443),
            }),
            url: None,
        },
        Endpoint::Url(url) => {
            WebhookClientConfig { ca_bundle, service: None, url: Some(format!("{}{path}", url.trim_end_matches('/'))) }
        }
    }
}

fn namespace_selector(opts: &WebhookOptions) -> LabelSelector {
    let mut excluded = vec!["kube-system".to_string()];
    if let Endpoint::Service { namespace, .. } = &opts.endpoint {
        excluded.push(namespace.clone());
    }
    for ns in &opts.exclude_namespaces {
        if !excluded.contains(ns) {
            excluded.push(ns.clone());
        }
    }
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "kubernetes.io/metadata.name".into(),
            operator: "NotIn".into(),
            values: Some(excluded),
        }]),
        match_labels: None,
    }
}

/// Both webhooks skip the kubelet: its only pod writes here are mirror pods of static pods,
/// which run whatever the API says — denying one only hides a running pod from the API (and
/// NodeRestriction already stops a kubelet from changing other pods' gates, labels or
/// annotations). Skipping Allot itself loses nothing: the engine allows its identity anyway.
/// No condition of the main webhooks looks at the object, so no tenant UPDATE of Allot's gates
/// or keys can skip the validating webhook (the status webhook's extra condition only skips
/// status writes that leave labels and annotations alone).
fn match_conditions(opts: &WebhookOptions) -> Vec<MatchCondition> {
    let mut out = vec![MatchCondition {
        name: "not-kubelet".into(),
        expression: "!request.userInfo.username.startsWith('system:node:')".into(),
    }];
    if let Some(sa) = &opts.service_account {
        out.push(MatchCondition {
            name: "not-allot-itself".into(),
            expression: format!("request.userInfo.username != {}", crate::admission::tenant::username_cel(sa, '\'')),
        });
    }
    out
}

/// The status subresource keeps a Pod's spec but takes its labels and annotations from the
/// request, so a tenant with `pods/status` could write Allot's reserved keys through it. Every
/// kubelet and controller status write would pay a fail-closed webhook call if it were
/// registered like the other subresources; this condition lets the API server send only the
/// status writes that change metadata (rare, and exactly the ones that can touch Allot's keys).
pub const METADATA_CHANGED: &str = "object.metadata.?labels.orValue({}) != oldObject.metadata.?labels.orValue({}) \
     || object.metadata.?annotations.orValue({}) != oldObject.metadata.?annotations.orValue({})";

/// Pod subresources whose UPDATE changes what Allot guards: an in-place resize could change
/// accelerator requests, and ephemeral containers are containers too. (Their objects are the
/// whole Pod, so the engine checks them as Pod UPDATEs: only Allot may move its gates and keys.)
pub const POD_SUBRESOURCES: &[&str] = &["pods/resize", "pods/ephemeralcontainers"];

/// `(group, plural)` for every kind in the workload table, and the guarded Pod subresources.
fn workload_resources() -> BTreeMap<&'static str, Vec<String>> {
    let mut by_group: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for w in WORKLOAD_KINDS {
        by_group.entry(w.group).or_default().push(format!("{}s", w.kind.to_lowercase()));
    }
    by_group.entry("").or_default().extend(POD_SUBRESOURCES.iter().map(|s| s.to_string()));
    by_group
}

/// The two configurations, in apply order.
pub fn render(opts: &WebhookOptions) -> (MutatingWebhookConfiguration, ValidatingWebhookConfiguration) {
    let meta = metadata(opts);
    let mutating =
        MutatingWebhookConfiguration { metadata: meta.clone(), webhooks: Some(vec![mutating_webhook(opts)]) };
    // Under --native-covers the Pod subresources keep the full check on the plain path: native
    // policies match `pods`, never `pods/resize` or `pods/ephemeralcontainers`.
    let split_subresources = opts.native_fingerprint.is_some();
    let mut webhooks = vec![
        validating_webhook(
            opts,
            "validate.allot.dev",
            &phase_path(opts, "validate"),
            match_conditions(opts),
            workload_rules(split_subresources),
        ),
        status_webhook(opts),
    ];
    if split_subresources {
        webhooks.push(subresources_webhook(opts));
    }
    let validating = ValidatingWebhookConfiguration { metadata: meta, webhooks: Some(webhooks) };
    (mutating, validating)
}

/// Both configurations share one name and label, so one `kubectl delete -l` removes them.
fn metadata(opts: &WebhookOptions) -> ObjectMeta {
    ObjectMeta {
        name: Some(opts.name.clone()),
        labels: Some(BTreeMap::from([("app.kubernetes.io/name".to_string(), "allot".to_string())])),
        ..Default::default()
    }
}

/// The mutating webhook sees Pod CREATEs only: defaults and gates are set once, at creation.
fn mutating_webhook(opts: &WebhookOptions) -> MutatingWebhook {
    MutatingWebhook {
        name: "mutate.allot.dev".into(),
        admission_review_versions: vec!["v1".into()],
        client_config: client_config(opts, &phase_path(opts, "mutate")),
        failure_policy: Some(opts.failure_policy.clone()),
        match_policy: Some("Equivalent".into()),
        namespace_selector: Some(namespace_selector(opts)),
        match_conditions: Some(match_conditions(opts)),
        reinvocation_policy: Some("IfNeeded".into()),
        side_effects: "None".into(),
        timeout_seconds: Some(opts.timeout_seconds),
        rules: Some(vec![RuleWithOperations {
            api_groups: Some(vec!["".into()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(vec!["CREATE".into()]),
            resources: Some(vec!["pods".into()]),
            scope: Some("Namespaced".into()),
        }]),
        object_selector: None,
    }
}

/// The main validating webhook's rules: every workload kind Allot checks (without the Pod
/// subresources when `split_subresources`, which get a webhook of their own), and claim creates.
fn workload_rules(split_subresources: bool) -> Vec<RuleWithOperations> {
    workload_resources()
        .into_iter()
        .map(|(group, mut resources)| {
            if split_subresources {
                resources.retain(|r| !POD_SUBRESOURCES.contains(&r.as_str()));
            }
            (group, resources)
        })
        .map(|(group, resources)| RuleWithOperations {
            api_groups: Some(vec![group.to_string()]),
            api_versions: Some(vec!["*".into()]),
            operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
            resources: Some(resources),
            scope: Some("Namespaced".into()),
        })
        .chain(std::iter::once(RuleWithOperations {
            // A shared claim made again under a name admitted pods name (see
            // `validate::check_claim_create`).
            api_groups: Some(vec!["resource.k8s.io".into()]),
            api_versions: Some(vec!["*".into()]),
            operations: Some(vec!["CREATE".into()]),
            resources: Some(vec!["resourceclaims".into()]),
            scope: Some("Namespaced".into()),
        }))
        .collect()
}

/// One validating webhook: all of Allot's share the endpoint, failure policy and namespaces.
fn validating_webhook(
    opts: &WebhookOptions,
    name: &str,
    path: &str,
    conditions: Vec<MatchCondition>,
    rules: Vec<RuleWithOperations>,
) -> ValidatingWebhook {
    ValidatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        client_config: client_config(opts, path),
        failure_policy: Some(opts.failure_policy.clone()),
        match_policy: Some("Equivalent".into()),
        namespace_selector: Some(namespace_selector(opts)),
        match_conditions: Some(conditions),
        side_effects: "None".into(),
        timeout_seconds: Some(opts.timeout_seconds),
        rules: Some(rules),
        object_selector: None,
    }
}

/// Status writes reach Allot only when they change metadata ([`METADATA_CHANGED`]).
fn status_webhook(opts: &WebhookOptions) -> ValidatingWebhook {
    let mut conditions = match_conditions(opts);
    conditions.push(MatchCondition { name: "metadata-changed".into(), expression: METADATA_CHANGED.into() });
    let rule = RuleWithOperations {
        api_groups: Some(vec!["".into()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(vec!["UPDATE".into()]),
        resources: Some(vec!["pods/status".into()]),
        scope: Some("Namespaced".into()),
    };
    validating_webhook(opts, "validate-metadata.allot.dev", "/validate", conditions, vec![rule])
}

/// Under `--native-covers`, the Pod subresources no native policy matches, on the full check.
fn subresources_webhook(opts: &WebhookOptions) -> ValidatingWebhook {
    let rule = RuleWithOperations {
        api_groups: Some(vec!["".into()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
        resources: Some(POD_SUBRESOURCES.iter().map(|s| s.to_string()).collect()),
        scope: Some("Namespaced".into()),
    };
    validating_webhook(opts, "validate-subresources.allot.dev", "/validate", match_conditions(opts), vec![rule])
}

/// Why the configurations could not be written out as YAML.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A configuration did not convert to JSON (to set its `apiVersion` and `kind`).
    #[error("{0}")]
    Json(serde_json::Error),
    /// A configuration did not serialize to YAML.
    #[error("{0}")]
    Yaml(serde_saphyr::SerializeError),
}

impl RenderError {
    /// A short, fixed label for logs and metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            RenderError::Json(_) => "json",
            RenderError::Yaml(_) => "yaml",
        }
    }
}

/// Both configurations as one multi-document YAML stream.
pub fn render_yaml(opts: &WebhookOptions) -> Result<String, RenderError> {
    let (m, v) = render(opts);
    let with_type = |value: serde_json::Value, kind: &str| {
        let mut map = serde_json::Map::new();
        map.insert("apiVersion".into(), "admissionregistration.k8s.io/v1".into());
        map.insert("kind".into(), kind.into());
        if let serde_json::Value::Object(rest) = value {
            map.extend(rest.into_iter().filter(|(k, _)| k != "apiVersion" && k != "kind"));
        }
        serde_json::Value::Object(map)
    };
    let m = with_type(serde_json::to_value(&m).map_err(RenderError::Json)?, "MutatingWebhookConfiguration");
    let v = with_type(serde_json::to_value(&v).map_err(RenderError::Json)?, "ValidatingWebhookConfiguration");
    let m = serde_saphyr::to_string(&m).map_err(RenderError::Yaml)?;
    let v = serde_saphyr::to_string(&v).map_err(RenderError::Yaml)?;
    Ok(format!("{m}---\n{v}"))
}
