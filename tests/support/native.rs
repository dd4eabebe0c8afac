//! Installing what `allot compile` and `allot webhooks` print on a test API server.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, MutatingWebhookConfiguration, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use kube::api::{Api, PostParams};
use serde_json::Value;

async fn create<K>(client: &kube::Client, doc: &Value) -> Result<(), kube::Error>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(doc.clone()).expect("the document parses as its kind");
    Api::<K>::all(client.clone()).create(&PostParams::default(), &object).await.map(drop)
}

/// Creates every document of a YAML stream of admission policies, their bindings and webhook
/// configurations, retrying server errors (etcd can time out on a loaded machine).
pub async fn create_all(client: &kube::Client, yaml: &str) {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("yaml");
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let mut attempt = 0;
        loop {
            let result = match kind.as_str() {
                "MutatingAdmissionPolicy" => create::<MutatingAdmissionPolicy>(client, &doc).await,
                "MutatingAdmissionPolicyBinding" => create::<MutatingAdmissionPolicyBinding>(client, &doc).await,
                "ValidatingAdmissionPolicy" => create::<ValidatingAdmissionPolicy>(client, &doc).await,
                "ValidatingAdmissionPolicyBinding" => create::<ValidatingAdmissionPolicyBinding>(client, &doc).await,
                "MutatingWebhookConfiguration" => create::<MutatingWebhookConfiguration>(client, &doc).await,
                "ValidatingWebhookConfiguration" => create::<ValidatingWebhookConfiguration>(client, &doc).await,
                other => panic!("unexpected kind {other}"),
            };
            match result {
                Ok(()) => break,
                Err(kube::Error::Api(e)) if e.code == 409 && attempt > 0 => break,
                Err(kube::Error::Api(e)) if e.code >= 500 && attempt < 5 => attempt += 1,
                Err(e) => panic!("the API server refused a {kind}: {e}"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Deletes every admission policy and binding `allot compile` made (annotated
/// `allot.dev/compiled-from`), and waits until none is listed.
pub async fn delete_compiled(client: &kube::Client) {
    async fn delete<K>(client: &kube::Client) -> usize
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let api = Api::<K>::all(client.clone());
        let compiled: Vec<String> = api
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .iter()
            .filter(|o| o.meta().annotations.as_ref().is_some_and(|a| a.contains_key("allot.dev/compiled-from")))
            .filter_map(|o| o.meta().name.clone())
            .collect();
        for name in &compiled {
            let _ = api.delete(name, &Default::default()).await;
        }
        compiled.len()
    }
    loop {
        let left = delete::<MutatingAdmissionPolicyBinding>(client).await
            + delete::<MutatingAdmissionPolicy>(client).await
            + delete::<ValidatingAdmissionPolicyBinding>(client).await
            + delete::<ValidatingAdmissionPolicy>(client).await;
        if left == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
