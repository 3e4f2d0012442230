//! A Kubernetes API server on 127.0.0.1 with just what the executor uses: Jobs (create, get,
//! delete), pods (list by label selector, logs with `limitBytes`), held in memory. The test plays
//! the Job controller and the kubelet: it marks Jobs ended and gives them a pod with an exit code
//! and logs. Every request is recorded, and anything else is answered 404 and recorded as
//! unexpected.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use paddock_kube::{JobSettings, KubernetesJobExecutor};
use serde_json::{json, Value};

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: HashMap<String, String>,
    pub body: Option<Value>,
}

#[derive(Default)]
struct Objects {
    /// (namespace, name) → the Job as stored (what was posted, plus uid and status).
    jobs: BTreeMap<(String, String), Value>,
    /// (namespace, name) → the pod and its logs.
    pods: BTreeMap<(String, String), (Value, Vec<u8>)>,
    seen: Vec<Seen>,
    unexpected: Vec<String>,
}

/// The server's state, shared with the test.
#[derive(Clone, Default)]
pub struct FakeApi(Arc<Mutex<Objects>>);

impl FakeApi {
    /// Starts the server on a free loopback port; the executor for `settings` connected to it
    /// through the real `kube::Client`.
    pub async fn start(settings: JobSettings) -> (Self, KubernetesJobExecutor) {
        let api = Self::default();
        let router = Router::new()
            .route(
                "/apis/batch/v1/namespaces/{ns}/jobs",
                axum::routing::post(create_job),
            )
            .route(
                "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
                get(get_job).delete(delete_job),
            )
            .route("/api/v1/namespaces/{ns}/pods", get(list_pods))
            .route("/api/v1/namespaces/{ns}/pods/{name}/log", get(pod_log))
            .fallback(unexpected)
            .with_state(api.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        tokio::spawn(async move { axum::serve(listener, router).await });
        let mut config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
        config.default_namespace = settings.namespace.clone();
        let client = kube::Client::try_from(config).expect("client");
        let executor = KubernetesJobExecutor::new(client, settings).expect("valid settings");
        (api, executor)
    }

    fn lock(&self) -> MutexGuard<'_, Objects> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The Job stored under `name` in `ns`.
    pub fn job(&self, ns: &str, name: &str) -> Option<Value> {
        self.lock().jobs.get(&(ns.to_owned(), name.to_owned())).cloned()
    }

    /// Stores a Job as if created by someone else.
    pub fn put_job(&self, ns: &str, job: Value) {
        let name = job["metadata"]["name"].as_str().expect("job name").to_owned();
        self.lock().jobs.insert((ns.to_owned(), name), job);
    }

    /// Deletes a Job (and its pods) behind the executor's back, as the TTL controller does.
    pub fn remove_job(&self, ns: &str, name: &str) {
        let mut objects = self.lock();
        objects.jobs.remove(&(ns.to_owned(), name.to_owned()));
        objects
            .pods
            .retain(|(pns, _), (pod, _)| !(pns == ns && pod["metadata"]["labels"]["job-name"] == name));
    }

    /// Plays the Job controller: adds a condition `kind` (`Complete`, `Failed`) with `reason`.
    pub fn end_job(&self, ns: &str, name: &str, kind: &str, reason: &str, message: &str) {
        let mut objects = self.lock();
        let job = objects
            .jobs
            .get_mut(&(ns.to_owned(), name.to_owned()))
            .expect("job to end exists");
        job["status"] = json!({
            "conditions": [
                {"type": if kind == "Complete" { "SuccessCriteriaMet" } else { "FailureTarget" },
                 "status": "True", "reason": reason},
                {"type": kind, "status": "True", "reason": reason, "message": message},
            ],
        });
    }

    /// Plays the kubelet: a pod of the Job whose `run` container exited with `exit_code` after
    /// writing `logs`. Labelled as the Job controller labels pods.
    pub fn add_pod(&self, ns: &str, job_name: &str, exit_code: i32, logs: &[u8]) {
        let mut objects = self.lock();
        let uid = objects.jobs[&(ns.to_owned(), job_name.to_owned())]["metadata"]["uid"].clone();
        let pod_name = format!("{job_name}-abcde");
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "creationTimestamp": "2026-12-05T00:00:00Z",
                "labels": {
                    "batch.kubernetes.io/controller-uid": uid,
                    "controller-uid": uid,
                    "batch.kubernetes.io/job-name": job_name,
                    "job-name": job_name,
                },
            },
            "status": {
                "phase": if exit_code == 0 { "Succeeded" } else { "Failed" },
                "containerStatuses": [{
                    "name": "run", "image": "img", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": exit_code, "reason": "Completed"}},
                }],
            },
        });
        objects
            .pods
            .insert((ns.to_owned(), pod_name), (pod, logs.to_vec()));
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// Panics if the executor made any request this server does not implement.
    pub fn assert_nothing_unexpected(&self) {
        let unexpected = self.lock().unexpected.clone();
        assert!(unexpected.is_empty(), "unexpected requests: {unexpected:?}");
    }

    fn record(&self, method: Method, path: String, query: HashMap<String, String>, body: Option<Value>) {
        self.lock().seen.push(Seen {
            method,
            path,
            query,
            body,
        });
    }
}

/// A `metav1.Status` failure, as the API server answers errors.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, Json(body)).into_response()
}

async fn create_job(
    State(api): State<FakeApi>,
    Path(ns): Path<String>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let job: Value = match serde_json::from_slice(&body) {
        Ok(job) => job,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    api.record(Method::POST, uri.path().to_owned(), query, Some(job.clone()));
    let Some(name) = job["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "metadata.name: Required".into(),
        );
    };
    let key = (ns.clone(), name.clone());
    let mut objects = api.lock();
    if objects.jobs.contains_key(&key) {
        let message = format!("jobs.batch \"{name}\" already exists");
        return status(StatusCode::CONFLICT, "AlreadyExists", message);
    }
    let mut stored = job;
    stored["metadata"]["namespace"] = json!(ns);
    stored["metadata"]["uid"] = json!(format!("uid-{name}"));
    stored["metadata"]["creationTimestamp"] = json!("2026-12-05T00:00:00Z");
    stored["status"] = json!({"active": 1});
    objects.jobs.insert(key, stored.clone());
    (StatusCode::CREATED, Json(stored)).into_response()
}

async fn get_job(
    State(api): State<FakeApi>,
    Path((ns, name)): Path<(String, String)>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    api.record(Method::GET, uri.path().to_owned(), query, None);
    match api.job(&ns, &name) {
        Some(job) => Json(job).into_response(),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("jobs.batch \"{name}\" not found"),
        ),
    }
}

async fn delete_job(
    State(api): State<FakeApi>,
    Path((ns, name)): Path<(String, String)>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let options = serde_json::from_slice::<Value>(&body).ok();
    api.record(Method::DELETE, uri.path().to_owned(), query, options);
    match api.job(&ns, &name) {
        Some(job) => {
            // Foreground deletion, finished at once: the pods go, then the Job.
            api.remove_job(&ns, &name);
            Json(job).into_response()
        }
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("jobs.batch \"{name}\" not found"),
        ),
    }
}

async fn list_pods(
    State(api): State<FakeApi>,
    Path(ns): Path<String>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    api.record(Method::GET, uri.path().to_owned(), query.clone(), None);
    // Equality selectors only (`a=b,c=d`), which is all the executor sends.
    let wanted: Vec<(String, String)> = query
        .get("labelSelector")
        .map(|s| {
            s.split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .unwrap_or_default();
    let items: Vec<Value> = api
        .lock()
        .pods
        .iter()
        .filter(|((pns, _), (pod, _))| {
            *pns == ns
                && wanted
                    .iter()
                    .all(|(k, v)| pod["metadata"]["labels"][k].as_str() == Some(v))
        })
        .map(|(_, (pod, _))| pod.clone())
        .collect();
    Json(json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})).into_response()
}

async fn pod_log(
    State(api): State<FakeApi>,
    Path((ns, name)): Path<(String, String)>,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    api.record(Method::GET, uri.path().to_owned(), query.clone(), None);
    let Some((_, logs)) = api.lock().pods.get(&(ns, name.clone())).cloned() else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("pods \"{name}\" not found"),
        );
    };
    let limit = match query.get("limitBytes").map(|l| l.parse::<usize>()) {
        None => logs.len(),
        Some(Ok(limit)) if limit > 0 => limit,
        Some(_) => {
            return status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "limitBytes: must be > 0".into(),
            )
        }
    };
    let body = logs[..logs.len().min(limit)].to_vec();
    (StatusCode::OK, [("content-type", "text/plain")], body).into_response()
}

async fn unexpected(State(api): State<FakeApi>, method: Method, uri: Uri) -> Response {
    api.lock().unexpected.push(format!("{method} {uri}"));
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("the fake API server has no {uri}"),
    )
}
