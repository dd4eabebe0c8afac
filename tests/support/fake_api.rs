//! A scenario fake of the Kubernetes API server, served in process under a `kube::Client`.
//!
//! It holds a small world of objects (Pods, Nodes, Namespaces, Leases, Events, …) and answers
//! what the gang controller and the Namespace watch ask: list and watch (a watch stays open and
//! carries an event for every change, whether the code under test or the test made it), get,
//! create, delete, and patch with JSON Patch, merge patch, strategic merge patch (lists of
//! conditions merge on `type`) and apply patches applied to the stored object. Every request
//! is recorded with who sent it, its RBAC attributes, content type, body and the status code
//! answered, so tests assert the exact calls. Tests can script failures (the next N requests
//! that match answer an error) and take a Lease away from its holder.
//!
//! Semantics it does not have: field and label selectors, resourceVersion preconditions,
//! admission, defaulting. What it answers for an unknown object is a 404 `Status`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};

/// One request, as the API server's RBAC sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Call {
    pub verb: String,
    pub group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The raw request, for messages.
    pub request: String,
}

/// One recorded request with everything a test may assert on.
#[derive(Debug, Clone)]
pub struct Request {
    /// The name the test gave the client that sent it (see [`FakeApi::client`]).
    pub client: String,
    pub method: String,
    pub call: Call,
    /// The request's content type (tells JSON Patch from merge, strategic and apply patches).
    pub content_type: String,
    /// The request body (`Null` when there was none or it was not JSON).
    pub body: Value,
    /// The status code answered.
    pub status: u16,
    /// When the fake received it.
    pub at: Instant,
}

impl Request {
    /// A write: create, update, patch or delete.
    pub fn is_write(&self) -> bool {
        matches!(self.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
    }

    /// `verb resource ns/name` (for messages).
    pub fn line(&self) -> String {
        format!(
            "[{}] {} {} {}/{} -> {} {}",
            self.client,
            self.call.verb,
            self.call.resource,
            self.call.namespace.as_deref().unwrap_or(""),
            self.call.name.as_deref().unwrap_or(""),
            self.status,
            if self.body.is_null() { String::new() } else { self.body.to_string() }
        )
    }
}

/// Maps a request to RBAC's attributes the way the API server's RequestInfoResolver does.
pub fn classify(method: &str, path: &str, query: &str) -> Call {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => panic!("not a resource path: {path}"),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let resource = rest.first().copied().unwrap_or_default();
    let name = rest.get(1).map(|s| s.to_string());
    let resource = match rest.get(2) {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    };
    let watch = query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    let verb = match (method, &name) {
        ("GET", _) if watch => "watch",
        ("GET", Some(_)) => "get",
        ("GET", None) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", Some(_)) => "delete",
        ("DELETE", None) => "deletecollection",
        _ => panic!("unexpected method {method} {path}"),
    };
    Call {
        verb: verb.into(),
        group: group.into(),
        resource,
        namespace,
        name,
        request: format!("{method} {path}{}{query}", if query.is_empty() { "" } else { "?" }),
    }
}

type FakeBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn respond(code: u16, body: &Value) -> hyper::Response<FakeBody> {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap());
    hyper::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes).boxed())
        .unwrap()
}

/// A `Status` object as the API server answers errors.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn reason_of(code: u16) -> &'static str {
    match code {
        404 => "NotFound",
        409 => "Conflict",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        _ => "Unknown",
    }
}

/// JSON merge patch (RFC 7386) of `patch` into `target`.
pub fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// The list merge keys of strategic merge patch for the fields the code under test patches.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "schedulingGates" | "containers" => Some("name"),
        _ => None,
    }
}

/// Strategic merge patch: a merge patch in which lists with a merge key merge item by item.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                match (merge_key(k), t.get_mut(k), v) {
                    (Some(key), Some(Value::Array(items)), Value::Array(patches)) => {
                        for item in patches {
                            match items.iter_mut().find(|i| i.get(key).is_some() && i.get(key) == item.get(key)) {
                                Some(existing) => strategic_merge(existing, item),
                                None => items.push(item.clone()),
                            }
                        }
                    }
                    _ => strategic_merge(t.entry(k.clone()).or_insert(Value::Null), v),
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Where an object lives: (resource, namespace or "", name).
type Key = (String, String, String);

/// Kinds of the lists the fake answers, by resource.
fn list_kind(resource: &str) -> String {
    match resource {
        "pods" => "PodList".into(),
        "nodes" => "NodeList".into(),
        "namespaces" => "NamespaceList".into(),
        "leases" => "LeaseList".into(),
        "events" => "EventList".into(),
        other => format!("{other}List"),
    }
}

/// The resource of a stored object's kind.
fn resource_of(kind: &str) -> String {
    match kind {
        "Pod" => "pods".into(),
        "Node" => "nodes".into(),
        "Namespace" => "namespaces".into(),
        "Lease" => "leases".into(),
        "Event" => "events".into(),
        other => format!("{}s", other.to_lowercase()),
    }
}

/// A failure the test scripted: the next `times` requests that `matches` answer `code`.
struct Failure {
    matches: Box<dyn Fn(&Request) -> bool + Send>,
    code: u16,
    times: usize,
}

/// One watch event as the API server streams it: a JSON object and a newline.
fn watch_line(event: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": event, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// An open watch: where its events go.
struct Watch {
    resource: String,
    sender: tokio::sync::mpsc::UnboundedSender<Bytes>,
}

#[derive(Default)]
struct Store {
    objects: BTreeMap<Key, Value>,
    resource_version: u64,
    watches: Vec<Watch>,
    failures: Vec<Failure>,
    requests: Vec<Request>,
    /// Every watch event so far, as (resourceVersion, resource, line): a watch that starts at
    /// a resourceVersion gets what happened after it, as from a real API server.
    history: Vec<(u64, String, Bytes)>,
    /// Watch events held back (see [`FakeApi::hold_watches`]), in order.
    held: Option<Vec<(String, Bytes)>>,
}

impl Store {
    fn next_version(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }

    /// Stores `object` (stamped with a new resourceVersion) and tells the watches.
    fn put(&mut self, key: Key, mut object: Value, event: &str) -> Value {
        let version = self.next_version();
        merge(&mut object, &json!({"metadata": {"resourceVersion": version}}));
        self.objects.insert(key.clone(), object.clone());
        self.notify(&key.0, event, &object);
        object
    }

    fn remove(&mut self, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        let version = self.next_version();
        merge(&mut object, &json!({"metadata": {"resourceVersion": version}}));
        self.notify(&key.0, "DELETED", &object);
        Some(object)
    }

    fn notify(&mut self, resource: &str, event: &str, object: &Value) {
        let line = watch_line(event, object);
        self.history.push((self.resource_version, resource.to_string(), line.clone()));
        if let Some(held) = self.held.as_mut() {
            held.push((resource.to_string(), line));
            return;
        }
        self.deliver(resource, line);
    }

    fn deliver(&mut self, resource: &str, line: Bytes) {
        self.watches.retain(|w| w.resource != resource || w.sender.send(line.clone()).is_ok());
    }
}

fn key_of(object: &Value) -> Key {
    let kind = object["kind"].as_str().unwrap_or_else(|| panic!("an object without kind: {object}"));
    let name = object["metadata"]["name"].as_str().unwrap_or_else(|| panic!("an object without name: {object}"));
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
    (resource_of(kind), namespace.to_string(), name.to_string())
}

/// The fake API server: its world, its record of requests, and clients that talk to it.
#[derive(Clone, Default)]
pub struct FakeApi {
    store: Arc<Mutex<Store>>,
}

impl FakeApi {
    /// An empty world.
    pub fn new() -> FakeApi {
        FakeApi { store: Arc::new(Mutex::new(Store { resource_version: 100, ..Store::default() })) }
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client whose requests are recorded as sent by `who`.
    pub fn client(&self, who: &str) -> kube::Client {
        let fake = self.clone();
        let who = who.to_string();
        let service = tower::service_fn(move |req| {
            let fake = fake.clone();
            let who = who.clone();
            async move { Ok::<_, Infallible>(fake.serve(&who, req).await) }
        });
        kube::Client::new(service, "default")
    }

    // --- the world -----------------------------------------------------------------------

    /// Adds or replaces objects (an ADDED or MODIFIED watch event each).
    pub fn add(&self, objects: impl IntoIterator<Item = Value>) {
        let mut store = self.lock();
        for o in objects {
            let key = key_of(&o);
            let event = if store.objects.contains_key(&key) { "MODIFIED" } else { "ADDED" };
            store.put(key, o, event);
        }
    }

    /// The stored object, if any (`resource` as in the URL: `pods`, `leases`, …).
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.lock().objects.get(&(resource.to_string(), namespace.to_string(), name.to_string())).cloned()
    }

    /// Every stored object of a resource.
    pub fn all(&self, resource: &str) -> Vec<Value> {
        self.lock().objects.iter().filter(|(k, _)| k.0 == resource).map(|(_, v)| v.clone()).collect()
    }

    /// Changes a stored object the way another client would (a MODIFIED watch event).
    pub fn update(&self, resource: &str, namespace: &str, name: &str, change: impl FnOnce(&mut Value)) {
        let mut store = self.lock();
        let key = (resource.to_string(), namespace.to_string(), name.to_string());
        let mut object = store.objects.get(&key).cloned().unwrap_or_else(|| panic!("no {resource} {namespace}/{name}"));
        change(&mut object);
        store.put(key, object, "MODIFIED");
    }

    /// Holds back watch events from now on (a slow watch): the code under test works from what
    /// it saw last until [`FakeApi::release_watches`].
    pub fn hold_watches(&self) {
        let mut store = self.lock();
        if store.held.is_none() {
            store.held = Some(Vec::new());
        }
    }

    /// Delivers the held watch events, in order, and stops holding.
    pub fn release_watches(&self) {
        let mut store = self.lock();
        for (resource, line) in store.held.take().unwrap_or_default() {
            store.deliver(&resource, line);
        }
    }

    /// Deletes a stored object the way another client would (a DELETED watch event).
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) {
        let key = (resource.to_string(), namespace.to_string(), name.to_string());
        self.lock().remove(&key).unwrap_or_else(|| panic!("no {resource} {namespace}/{name}"));
    }

    /// Another replica takes the Lease: it holds it from now, renewed now.
    pub fn take_lease(&self, namespace: &str, name: &str, holder: &str) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        self.update("leases", namespace, name, |lease| {
            let transitions = lease["spec"]["leaseTransitions"].as_i64().unwrap_or(0) + 1;
            merge(
                lease,
                &json!({"spec": {"holderIdentity": holder, "acquireTime": now, "renewTime": now,
                                 "leaseDurationSeconds": 15, "leaseTransitions": transitions}}),
            );
        });
    }

    /// The holder of a Lease, if it exists and has one.
    pub fn lease_holder(&self, namespace: &str, name: &str) -> Option<String> {
        self.get("leases", namespace, name)?["spec"]["holderIdentity"].as_str().map(str::to_string)
    }

    /// The next `times` requests for which `matches` holds answer `code` (and change nothing).
    pub fn fail(&self, times: usize, code: u16, matches: impl Fn(&Request) -> bool + Send + 'static) {
        self.lock().failures.push(Failure { matches: Box::new(matches), code, times });
    }

    // --- the record ----------------------------------------------------------------------

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.lock().requests.clone()
    }

    /// Every request so far, as RBAC attributes.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().requests.iter().map(|r| r.call.clone()).collect()
    }

    /// Waits (polling) until `done` holds for the requests so far; panics with the record
    /// after `timeout`. No fixed sleep: a loaded machine only makes it slower.
    pub async fn wait_for(&self, what: &str, timeout: Duration, done: impl Fn(&[Request]) -> bool) -> Vec<Request> {
        let deadline = Instant::now() + timeout;
        loop {
            let requests = self.requests();
            if done(&requests) {
                return requests;
            }
            if Instant::now() > deadline {
                panic!("timed out after {timeout:?} waiting for {what}; requests:\n{}", dump(&requests));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // --- the server ----------------------------------------------------------------------

    async fn serve(&self, who: &str, req: hyper::Request<kube::client::Body>) -> hyper::Response<FakeBody> {
        let method = req.method().as_str().to_string();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or_default().to_string();
        let content_type =
            req.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if let Some(answer) = discovery(&method, &path) {
            // Granted to every authenticated user (`system:discovery`): not an RBAC call, and
            // not recorded.
            return answer;
        }
        let call = classify(&method, &path, &query);
        let mut request =
            Request { client: who.into(), method, call, content_type, body, status: 0, at: Instant::now() };
        let mut store = self.lock();
        let scripted = store.failures.iter_mut().find(|f| f.times > 0 && (f.matches)(&request)).map(|f| {
            f.times -= 1;
            f.code
        });
        let (code, response) = match scripted {
            Some(code) => (code, Response::Json(status(code, reason_of(code), "scripted failure"))),
            None => answer(&mut store, &request),
        };
        request.status = code;
        store.requests.push(request);
        match response {
            Response::Json(body) => respond(code, &body),
            Response::Watch(receiver) => {
                let stream = futures::stream::unfold(receiver, |mut r| async move {
                    r.recv().await.map(|line| (Ok::<_, Infallible>(Frame::data(line)), r))
                });
                hyper::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(http_body_util::StreamBody::new(stream).boxed())
                    .unwrap()
            }
        }
    }
}

/// The answer to discovery of one group version (`GET /apis/GROUP/VERSION`): the fake serves
/// native PodGroups (`scheduling.k8s.io/v1alpha2`, as an API server with the `GenericWorkload`
/// gate on does) and discovers no other group version; `None` for any other request.
fn discovery(method: &str, path: &str) -> Option<hyper::Response<FakeBody>> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let ["apis", group, version] = parts.as_slice() else { return None };
    if method != "GET" {
        return None;
    }
    if (*group, *version) != ("scheduling.k8s.io", "v1alpha2") {
        return Some(respond(404, &status(404, "NotFound", &format!("the server could not find {path}"))));
    }
    let podgroups = json!({"name": "podgroups", "singularName": "podgroup", "namespaced": true, "kind": "PodGroup",
                           "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]});
    Some(respond(
        200,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "scheduling.k8s.io/v1alpha2",
                "resources": [podgroups]}),
    ))
}

enum Response {
    Json(Value),
    Watch(tokio::sync::mpsc::UnboundedReceiver<Bytes>),
}

fn not_found(call: &Call) -> (u16, Response) {
    (404, Response::Json(status(404, "NotFound", &format!("{} not found", call.request))))
}

/// The fake's answer to one request, with its effect on the world.
fn answer(store: &mut Store, request: &Request) -> (u16, Response) {
    let call = &request.call;
    let (resource, subresource) = call.resource.split_once('/').unwrap_or((call.resource.as_str(), ""));
    let namespace = call.namespace.clone().unwrap_or_default();
    let key = (resource.to_string(), namespace.clone(), call.name.clone().unwrap_or_default());
    match call.verb.as_str() {
        "list" => {
            let items: Vec<Value> = store
                .objects
                .iter()
                .filter(|(k, _)| k.0 == resource && (call.namespace.is_none() || k.1 == namespace))
                .map(|(_, v)| v.clone())
                .collect();
            let version = store.resource_version.to_string();
            (
                200,
                Response::Json(json!({"apiVersion": "v1", "kind": list_kind(resource),
                                      "metadata": {"resourceVersion": version}, "items": items})),
            )
        }
        "watch" => {
            let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
            let since: u64 = request
                .call
                .request
                .split(['?', '&'])
                .find_map(|kv| kv.strip_prefix("resourceVersion="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX);
            let initial_events = request.call.request.split(['?', '&']).any(|kv| kv == "sendInitialEvents=true");
            if initial_events {
                // A streaming list (Kubernetes' WatchList): every current object as ADDED, then a
                // BOOKMARK that says the initial events are over, then the changes that follow.
                for (_, object) in store
                    .objects
                    .iter()
                    .filter(|(k, _)| k.0 == resource && (call.namespace.is_none() || k.1 == namespace))
                {
                    let _ = sender.send(watch_line("ADDED", object));
                }
                let version = store.resource_version.to_string();
                let bookmark = json!({
                    "apiVersion": "v1", "kind": list_kind(resource).trim_end_matches("List"),
                    "metadata": {"resourceVersion": version, "annotations": {"k8s.io/initial-events-end": "true"}}});
                let _ = sender.send(watch_line("BOOKMARK", &bookmark));
            } else {
                for (_, _, line) in store.history.iter().filter(|(v, r, _)| *v > since && r == resource) {
                    let _ = sender.send(line.clone());
                }
            }
            store.watches.push(Watch { resource: resource.to_string(), sender });
            (200, Response::Watch(receiver))
        }
        "get" => match store.objects.get(&key) {
            Some(o) => (200, Response::Json(o.clone())),
            None => not_found(call),
        },
        "create" => {
            let mut object = request.body.clone();
            if object["metadata"]["name"].as_str().is_none() {
                let prefix = object["metadata"]["generateName"].as_str().unwrap_or("object-").to_string();
                let name = format!("{prefix}{}", store.resource_version + 1);
                merge(&mut object, &json!({"metadata": {"name": name}}));
            }
            if call.namespace.is_some() {
                merge(&mut object, &json!({"metadata": {"namespace": namespace}}));
            }
            let key = (resource.to_string(), namespace, object["metadata"]["name"].as_str().unwrap_or_default().into());
            if store.objects.contains_key(&key) {
                return (409, Response::Json(status(409, "AlreadyExists", &format!("{} already exists", key.2))));
            }
            (201, Response::Json(store.put(key, object, "ADDED")))
        }
        "delete" => match store.remove(&key) {
            Some(o) => (200, Response::Json(o)),
            None => not_found(call),
        },
        "patch" | "update" => {
            let Some(mut object) = store.objects.get(&key).cloned() else { return not_found(call) };
            let before = object.clone();
            let body = &request.body;
            // An update that names a resourceVersion is a precondition, as on the API server.
            let expected = body["metadata"]["resourceVersion"].as_str().filter(|v| !v.is_empty());
            if call.verb == "update"
                && expected.is_some_and(|v| Some(v) != object["metadata"]["resourceVersion"].as_str())
            {
                let message =
                    "the object has been modified; please apply your changes to the latest version and try again";
                return (409, Response::Json(status(409, "Conflict", message)));
            }
            let patched: Result<(), String> = if call.verb == "update" {
                object = body.clone();
                Ok(())
            } else if request.content_type.starts_with("application/json-patch+json") {
                serde_json::from_value::<json_patch::Patch>(body.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|p| json_patch::patch(&mut object, &p).map_err(|e| e.to_string()))
            } else {
                // Merge, strategic merge and apply patches; type metadata is not patched.
                let mut patch = body.clone();
                if let Some(p) = patch.as_object_mut() {
                    p.remove("apiVersion");
                    p.remove("kind");
                }
                if request.content_type.starts_with("application/merge-patch+json") {
                    merge(&mut object, &patch);
                } else {
                    strategic_merge(&mut object, &patch);
                }
                Ok(())
            };
            match patched {
                Err(e) => (422, Response::Json(status(422, "Invalid", &format!("the patch does not apply: {e}")))),
                // A status patch changes only the status (and a main-resource patch never it).
                Ok(()) => {
                    if subresource == "status" {
                        let status = object["status"].clone();
                        object = before.clone();
                        object["status"] = status;
                    }
                    if object == before {
                        (200, Response::Json(object))
                    } else {
                        (200, Response::Json(store.put(key, object, "MODIFIED")))
                    }
                }
            }
        }
        _ => not_found(call),
    }
}

/// The requests, one a line (for failure messages).
pub fn dump(requests: &[Request]) -> String {
    requests.iter().map(|r| format!("  {}", r.line())).collect::<Vec<_>>().join("\n")
}

// --- objects for scenarios -------------------------------------------------------------------

/// A Namespace.
pub fn namespace(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}})
}

/// A Node with `gpus` allocatable GPUs.
pub fn gpu_node(name: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()}}
    })
}

/// A pending Pod held by `gate`, asking for one GPU.
pub fn gated_pod(
    ns: &str,
    name: &str,
    gate: &str,
    created: &str,
    labels: Value,
    annotations: Value,
    owner: Option<(&str, &str, &str)>,
) -> Value {
    let owners: Vec<Value> = owner
        .into_iter()
        .map(|(api_version, kind, name)| {
            json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": format!("uid-{name}"), "controller": true})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"), "creationTimestamp": created,
                     "labels": labels, "annotations": annotations, "ownerReferences": owners},
        "spec": {
            "schedulingGates": [{"name": gate}],
            "containers": [{"name": "train", "image": "trainer:1",
                            "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}]
        },
        "status": {"phase": "Pending"}
    })
}
