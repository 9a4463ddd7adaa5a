//! Pod name, namespace and container name from the kubelet's read-only API
//! (`--kubernetes`, `GET URL/pods`: a `PodList` of the node's pods), matched to a process
//! by the pod UID and container id its cgroup path names (cpi-user/src/procmap/cgroup.rs).
//!
//! The kubelet is untrusted input and may be dead: one request has one deadline
//! ([`TIMEOUT`]) and its answer is read up to [`MAX_BODY`] bytes (which bounds what is
//! cached); the list is fetched again on a miss (a pod or container not in it) at most
//! every [`REFRESH`], and every [`REFRESH`] when pods are selected
//! (cpi-user/src/agent/pods.rs), so a dead or hostile kubelet costs one or two requests
//! per [`REFRESH`], never a stall of the windows. Requests are counted by result
//! (`cpi_bpf_kubelet_requests_total`); one line is logged when fetches start failing and
//! one when they succeed again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::pods::{PodSelector, Selection};
use super::Level;
use crate::procmap::ProcessIdentity;

/// The kubelet's read-only port on the node.
pub const DEFAULT_URL: &str = "http://127.0.0.1:10255";
/// Where a node keeps its pods' directories: their presence turns `--kubernetes` on.
pub const PODS_DIR: &str = "/var/lib/kubelet/pods";
/// Deadline of one `/pods` request.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Shortest time between two fetches.
pub const REFRESH: Duration = Duration::from_secs(10);
/// Bytes of a `/pods` answer read at most (a node's 110 pods take about 1 MB).
pub const MAX_BODY: u64 = 16 << 20;

/// What the kubelet says of one pod.
#[derive(Clone, Debug, PartialEq)]
pub struct Pod {
    name: String,
    namespace: String,
    /// Container id (the runtime's, without its `containerd://` scheme) → name.
    containers: HashMap<String, String>,
}

/// The node's pods by UID, as last fetched.
#[derive(Debug)]
pub struct Kubelet {
    http: ureq::Agent,
    url: String,
    pods: HashMap<String, Pod>,
    fetched: Option<Instant>,
    answered: u64,
    failures: u64,
    failing: bool,
}

/// A fetch that failed, in words for the log.
#[derive(Debug, thiserror::Error)]
#[error("kubelet {url}: {detail}")]
pub struct KubeletError {
    url: String,
    detail: String,
}

impl Kubelet {
    /// A client of the kubelet at `base` (`http://host:port`); nothing is fetched yet.
    pub fn new(base: &str) -> Kubelet {
        let http = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .max_redirects(0)
            .http_status_as_error(false)
            .max_response_header_size(super::push::MAX_HEAD)
            .proxy(None)
            .build()
            .into();
        Kubelet {
            http,
            url: format!("{}/pods", base.trim_end_matches('/')),
            pods: HashMap::new(),
            fetched: None,
            answered: 0,
            failures: 0,
            failing: false,
        }
    }

    /// Requests since start: (answered with a pod list, failed).
    pub fn requests(&self) -> (u64, u64) {
        (self.answered, self.failures)
    }

    /// Fills in the pod name, namespace and container name of `id` from the cache,
    /// fetching the pod list first when `id`'s pod or container is not in it and the
    /// last fetch is older than [`REFRESH`]. `log` gets one line when fetches start
    /// failing and one when they work again.
    pub fn fill(&mut self, id: &mut ProcessIdentity, log: &dyn Fn(Level, &str)) {
        let Some(uid) = id.pod_uid.as_deref() else {
            return;
        };
        let known = |pods: &HashMap<String, Pod>| {
            pods.get(uid).is_some_and(|p| {
                id.container_id
                    .as_ref()
                    .is_none_or(|c| p.containers.contains_key(c))
            })
        };
        if !known(&self.pods) && self.fetched.is_none_or(|t| t.elapsed() >= REFRESH) {
            self.refresh(log);
        }
        if let Some(p) = self.pods.get(uid) {
            id.pod = Some(p.name.clone());
            id.namespace = Some(p.namespace.clone());
            id.container = id
                .container_id
                .as_ref()
                .and_then(|c| p.containers.get(c).cloned());
        }
    }

    /// Fetches the pod list now; on failure the last list stays. `log` as in
    /// [`Kubelet::fill`].
    pub fn refresh(&mut self, log: &dyn Fn(Level, &str)) {
        self.fetched = Some(Instant::now());
        match self.fetch() {
            Ok(pods) => {
                self.pods = pods;
                self.answered += 1;
                if self.failing {
                    self.failing = false;
                    log(
                        Level::Info,
                        &format!("kubelet {}: answering again", self.url),
                    );
                }
            }
            Err(e) => {
                self.failures += 1;
                if !self.failing {
                    self.failing = true;
                    log(
                        Level::Warn,
                        &format!("{e} (pod names unknown until it answers)"),
                    );
                }
            }
        }
    }

    /// The pods (and in them the containers, when `sel` names one) that `sel` chooses
    /// among those last fetched.
    pub fn select(&self, sel: &PodSelector) -> Selection {
        let is = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        Selection(
            self.pods
                .iter()
                .filter(|(_, p)| is(&sel.pod, &p.name) && is(&sel.namespace, &p.namespace))
                .filter_map(|(uid, p)| {
                    let containers = match &sel.container {
                        None => None,
                        Some(name) => {
                            let ids: Vec<String> = p
                                .containers
                                .iter()
                                .filter(|(_, n)| *n == name)
                                .map(|(id, _)| id.clone())
                                .collect();
                            if ids.is_empty() {
                                return None;
                            }
                            Some(ids)
                        }
                    };
                    Some((uid.clone(), containers))
                })
                .collect(),
        )
    }

    fn fetch(&self) -> Result<HashMap<String, Pod>, KubeletError> {
        let err = |detail: String| KubeletError {
            url: self.url.clone(),
            detail,
        };
        let mut answer = self
            .http
            .get(&self.url)
            .call()
            .map_err(|e| err(describe(&e)))?;
        let code = answer.status().as_u16();
        if code != 200 {
            return Err(err(format!("HTTP {code}")));
        }
        let body = answer
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| err(describe(&e)))?;
        parse_pods(&body).map_err(err)
    }
}

fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::BodyExceedsLimit(n) => format!("an answer over {n} bytes"),
        ureq::Error::Timeout(_) => format!("no complete answer within {} s", TIMEOUT.as_secs()),
        e => e.to_string(),
    }
}

#[derive(Deserialize)]
struct PodList {
    items: Vec<PodItem>,
}

#[derive(Deserialize)]
struct PodItem {
    metadata: Metadata,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
    namespace: String,
    uid: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    init_container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStatus {
    name: String,
    /// `containerd://<ID>`, `cri-o://<ID>`, `docker://<ID>`; absent while creating.
    #[serde(default, rename = "containerID")]
    container_id: Option<String>,
}

/// The pods of a kubelet `/pods` answer, by UID (public for tests/tests/it/fuzz.rs).
pub fn parse_pods(body: &[u8]) -> Result<HashMap<String, Pod>, String> {
    let list: PodList = serde_json::from_slice(body).map_err(|e| format!("not a pod list: {e}"))?;
    Ok(list
        .items
        .into_iter()
        .map(|it| {
            let s = it.status;
            let containers = s
                .container_statuses
                .into_iter()
                .chain(s.init_container_statuses)
                .chain(s.ephemeral_container_statuses)
                .filter_map(|c| {
                    let id = c.container_id?;
                    let id = id.split_once("://").map_or(id.as_str(), |(_, i)| i);
                    Some((id.to_string(), c.name))
                })
                .collect();
            let pod = Pod {
                name: it.metadata.name,
                namespace: it.metadata.namespace,
                containers,
            };
            (it.metadata.uid, pod)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "74c13223-5a00-11e9-b385-42010a80018d";
    const ID: &str = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d";

    #[test]
    fn pod_list_by_uid_with_container_names() {
        let body = format!(
            r#"{{"kind":"PodList","apiVersion":"v1","items":[
              {{"metadata":{{"name":"web-1","namespace":"shop","uid":"{UID}"}},
                "spec":{{}},
                "status":{{"containerStatuses":[{{"name":"nginx","containerID":"containerd://{ID}"}},
                                               {{"name":"starting"}}]}}}},
              {{"metadata":{{"name":"pending","namespace":"x","uid":"u2"}}}}]}}"#
        );
        let pods = parse_pods(body.as_bytes()).unwrap();
        assert_eq!(pods.len(), 2);
        let p = &pods[UID];
        assert_eq!((p.name.as_str(), p.namespace.as_str()), ("web-1", "shop"));
        assert_eq!(p.containers.get(ID).map(String::as_str), Some("nginx"));
        assert_eq!(p.containers.len(), 1);
        assert!(parse_pods(b"{\"items\": 3}").is_err());
        assert!(parse_pods(b"<html>").is_err());
    }

    #[test]
    fn dead_kubelet_is_one_line_counted_failures_and_no_stall() {
        // A port nothing listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut k = Kubelet::new(&format!("http://127.0.0.1:{port}"));
        let lines = std::cell::RefCell::new(Vec::new());
        let mut id = ProcessIdentity {
            pod_uid: Some(UID.into()),
            ..ProcessIdentity::default()
        };
        let began = Instant::now();
        for _ in 0..100 {
            k.fill(&mut id, &|level, l| {
                lines.borrow_mut().push((level, l.to_string()))
            });
        }
        // One fetch within REFRESH, however many misses.
        assert!(began.elapsed() < REFRESH);
        assert_eq!(k.requests(), (0, 1));
        let lines = lines.into_inner();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].0 == Level::Warn && lines[0].1.contains("/pods"),
            "{lines:?}"
        );
        assert_eq!(id.pod, None);
    }

    #[test]
    fn selectors_choose_pods_and_containers() {
        let body = format!(
            r#"{{"items":[
              {{"metadata":{{"name":"web-1","namespace":"shop","uid":"{UID}"}},
                "status":{{"containerStatuses":[{{"name":"nginx","containerID":"containerd://{ID}"}},
                                               {{"name":"sidecar","containerID":"containerd://ab"}}]}}}},
              {{"metadata":{{"name":"web-1","namespace":"test","uid":"u2"}}}},
              {{"metadata":{{"name":"db-0","namespace":"shop","uid":"u3"}}}}]}}"#
        );
        let mut k = Kubelet::new("http://127.0.0.1:1");
        k.pods = parse_pods(body.as_bytes()).unwrap();
        let sel = |pod: Option<&str>, namespace: Option<&str>, container: Option<&str>| {
            let s = k.select(&PodSelector {
                pod: pod.map(str::to_string),
                namespace: namespace.map(str::to_string),
                container: container.map(str::to_string),
            });
            let mut v: Vec<(String, Option<Vec<String>>)> = s.0.into_iter().collect();
            v.sort();
            v
        };
        let whole = |uid: &str| (uid.to_string(), None);
        assert_eq!(sel(Some("web-1"), None, None), [whole(UID), whole("u2")]);
        assert_eq!(sel(Some("web-1"), Some("shop"), None), [whole(UID)]);
        assert_eq!(sel(None, Some("shop"), None), [whole(UID), whole("u3")]);
        assert_eq!(
            sel(None, None, Some("nginx")),
            [(UID.to_string(), Some(vec![ID.to_string()]))]
        );
        assert_eq!(sel(Some("nope"), None, None), []);
    }
}
