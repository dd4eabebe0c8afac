//! The Events a test reads back: what Allot told a pod's owner.

use kube::api::Api;

/// Events of `ns` with `reason`, as (object, message).
pub async fn events(admin: &kube::Client, ns: &str, reason: &str) -> Vec<(String, String)> {
    let list = Api::<k8s_openapi::api::core::v1::Event>::namespaced(admin.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .expect("events");
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| (e.involved_object.name.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}
