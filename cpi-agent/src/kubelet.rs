//! Pod name, namespace and container name from the kubelet's read-only API
//! (`--kubernetes`, `GET URL/pods`: a `PodList` of the node's pods), matched to a process
//! by the pod UID and container id its cgroup path names (cpi-user/src/procmap/cgroup.rs).
//!
//! The kubelet is untrusted input and may be dead: one request has one deadline
//! (`TIMEOUT`) and its answer is read up to `MAX_BODY` bytes (which bounds what is
//! cached); the list is fetched again on a miss (a pod or container not in it) at most
//! every `REFRESH`, and every `REFRESH` when pods are selected
//! (cpi-agent/src/pods.rs), so a dead or hostile kubelet costs one or two requests
//! per `REFRESH`, never a stall of the windows.
//!
//! Names are believed only from a peer that proves who it is (`Peer`): over https, a
//! server the system's or the pod's service-account CA vouches for (sent the pod's
//! service-account token); over http, a loopback port whose listening socket belongs to
//! root or the agent's own user (cpi-agent/src/peer.rs). Any user can listen on
//! 127.0.0.1:10255 where the kubelet's read-only port is off, and would otherwise name
//! root's pods and steer `--pod`; an answer from elsewhere is refused and processes keep
//! their cgroup-derived ids only. Requests are counted by result
//! (`cpi_bpf_kubelet_requests_total`: ok, failed, refused); one line is logged when
//! fetches start failing or being refused, and one when they succeed again.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::peer::Peer;
use super::pods::{PodSelector, Selection};
use cpi_user::procmap::ProcessIdentity;

/// The kubelet's read-only port on the node.
pub(crate) const DEFAULT_URL: &str = "http://127.0.0.1:10255";
/// Where a node keeps its pods' directories: their presence turns `--kubernetes` on.
pub(crate) const PODS_DIR: &str = "/var/lib/kubelet/pods";
/// Deadline of one `/pods` request.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(2);
/// Shortest time between two fetches.
pub(crate) const REFRESH: Duration = Duration::from_secs(10);
/// Bytes of a `/pods` answer read at most (a node's 110 pods take about 1 MB).
pub(crate) const MAX_BODY: u64 = 16 << 20;
/// The pod's service-account token, sent over https when present.
pub(crate) const SA_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// The cluster's CA, trusted over https when present.
pub(crate) const SA_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
/// Bytes of the token read at most (a projected token takes about 1 KB).
const MAX_TOKEN: u64 = 64 << 10;

/// Requests for the pod list since start, by result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    /// Answered with a pod list that was believed.
    pub ok: u64,
    /// No answer, not HTTP 200, not a pod list, or nothing listening.
    pub failed: u64,
    /// Not believed: a peer that could be anyone (`Peer`).
    pub refused: u64,
}

/// What the last fetch came to: a line is logged when it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Answering,
    Failing,
    Refused,
}

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
pub(crate) struct Kubelet {
    http: ureq::Agent,
    url: String,
    peer: Peer,
    pods: HashMap<String, Pod>,
    fetched: Option<Instant>,
    requests: Requests,
    state: State,
}

/// A fetch that failed or whose answer was not believed, in words for the log.
#[derive(Debug, thiserror::Error)]
#[error("kubelet {url}: {detail}")]
pub(crate) struct KubeletError {
    url: String,
    detail: String,
    /// Not believed (rather than not had).
    refused: bool,
}

impl Kubelet {
    /// A client of the kubelet at `base` (`http[s]://host:port`); nothing is fetched yet.
    pub fn new(base: &str) -> Kubelet {
        let peer = Peer::of(base);
        let mut b = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            .max_redirects(0)
            .http_status_as_error(false)
            .max_response_header_size(super::push::MAX_HEAD)
            .proxy(None);
        if peer == Peer::Tls {
            // The system's CAs, and the cluster's where the pod has it (it signs the
            // kubelet's serving certificate under `serverTLSBootstrap`); an unreadable
            // one leaves the system's, and a kubelet they do not vouch for fails.
            let ca = Path::new(SA_CA);
            let roots = super::push::root_certs(ca.is_file().then_some(ca))
                .or_else(|_| super::push::root_certs(None));
            if let Ok(roots) = roots {
                b = b.tls_config(ureq::tls::TlsConfig::builder().root_certs(roots).build());
            }
        }
        Kubelet {
            http: peer.client(b.build()),
            url: format!("{}/pods", base.trim_end_matches('/')),
            peer,
            pods: HashMap::new(),
            fetched: None,
            requests: Requests::default(),
            state: State::Answering,
        }
    }

    /// Requests since start, by result.
    pub fn requests(&self) -> Requests {
        self.requests
    }

    /// Fills in the pod name, namespace and container name of `id` from the cache,
    /// fetching the pod list first when `id`'s pod or container is not in it and the
    /// last fetch is older than [`REFRESH`]. Logs one line when fetches start failing
    /// and one when they work again.
    pub fn fill(&mut self, id: &mut ProcessIdentity) {
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
            self.refresh();
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

    /// Fetches the pod list now; on failure the last list stays. Logs as
    /// [`Kubelet::fill`].
    pub fn refresh(&mut self) {
        self.fetched = Some(Instant::now());
        let (state, line) = match self.fetch() {
            Ok(pods) => {
                self.pods = pods;
                self.requests.ok += 1;
                let line = format!("kubelet {}: answering again", self.url);
                (State::Answering, (log::Level::Info, line))
            }
            Err(e) if e.refused => {
                self.requests.refused += 1;
                cpi_user::fsafe::budget::refused(cpi_user::fsafe::budget::Reader::Kubelet);
                let line = format!(
                    "{e}; its pod, namespace and container names are not used (cgroup ids \
                     only) until an answer can be believed"
                );
                (State::Refused, (log::Level::Warn, line))
            }
            Err(e) => {
                self.requests.failed += 1;
                let line = format!("{e} (pod names unknown until it answers)");
                (State::Failing, (log::Level::Warn, line))
            }
        };
        if state != self.state {
            self.state = state;
            log::log!(line.0, "{}", line.1);
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

    fn error(&self, detail: String, refused: bool) -> KubeletError {
        KubeletError {
            url: self.url.clone(),
            detail,
            refused,
        }
    }

    /// The pod list, if its peer proves who it is. On loopback the listeners are looked
    /// at before the request (an unproven peer is sent nothing and cannot hold the agent
    /// for [`TIMEOUT`]) and again after the answer, so a foreign answer passes only if
    /// root's listener was there at both ends and gone between: only when root's own
    /// service restarts within the request, which a user cannot time at will. (Looking up the
    /// connection's own server side would close even that, but once closed into
    /// TIME_WAIT it reads as uid 0 in /proc/net/tcp, and the HTTP client hides the
    /// connection's addresses.)
    fn fetch(&self) -> Result<HashMap<String, Pod>, KubeletError> {
        self.vouch()?;
        let pods = self.get()?;
        self.vouch()?;
        Ok(pods)
    }

    /// Why the peer is not believed now, if it is not.
    fn vouch(&self) -> Result<(), KubeletError> {
        match &self.peer {
            Peer::Tls => Ok(()),
            Peer::Unproven(_) => Err(self.error(
                "not believed: plain http to an address other than loopback proves nothing \
                 of who answers (use https://, or the kubelet's port on loopback)"
                    .into(),
                true,
            )),
            peer @ Peer::Loopback(_) => peer
                .distrusted_now()
                .map_or(Ok(()), |(detail, refused)| Err(self.error(detail, refused))),
        }
    }

    fn get(&self) -> Result<HashMap<String, Pod>, KubeletError> {
        let err = |detail: String| self.error(detail, false);
        let mut request = self.http.get(&self.url);
        if self.peer == Peer::Tls {
            if let Some(t) = token(Path::new(SA_TOKEN)) {
                request = request.header("Authorization", format!("Bearer {t}"));
            }
        }
        let mut answer = request.call().map_err(|e| err(describe(&e)))?;
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

/// The service-account token at `path`, if there is one (it rotates: read each time).
fn token(path: &Path) -> Option<String> {
    let mut t = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_TOKEN)
        .read_to_string(&mut t)
        .ok()?;
    let t = t.trim();
    (!t.is_empty()).then(|| t.to_string())
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
        let mut id = ProcessIdentity {
            pod_uid: Some(UID.into()),
            ..ProcessIdentity::default()
        };
        let began = Instant::now();
        let ((), lines) = crate::test_log::capture(|| {
            for _ in 0..100 {
                k.fill(&mut id);
            }
        });
        // One fetch within REFRESH, however many misses.
        assert!(began.elapsed() < REFRESH);
        let failed = Requests {
            failed: 1,
            ..Requests::default()
        };
        assert_eq!(k.requests(), failed);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].0 == log::Level::Warn && lines[0].1.contains("/pods"),
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

    /// A kubelet on 127.0.0.1 answering every request with `body`, its socket created
    /// as `fsuid` (the thread's own: the kernel gives a socket its creator's fsuid, and
    /// setfsuid changes only the calling thread's); its port.
    fn serve(body: String, fsuid: u32) -> u16 {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: setfsuid has no memory effects; it changes this thread's fsuid.
            unsafe { libc::syscall(libc::SYS_setfsuid, fsuid) };
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            // SAFETY: as above, back to the thread's euid.
            unsafe { libc::syscall(libc::SYS_setfsuid, cpi_user::fsafe::euid()) };
            tx.send(l.local_addr().unwrap().port()).unwrap();
            for mut s in l.incoming().flatten() {
                use std::io::Write;
                let mut head = [0u8; 4096];
                let _ = s.read(&mut head);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        rx.recv().unwrap()
    }

    /// Hostile host: a user who listens where the kubelet's read-only port would be names
    /// root's pod. Refused: no name, counted, one line naming the uid and port; the
    /// same answer from root's socket is believed.
    #[test]
    fn a_kubelet_port_another_user_listens_on_names_nothing() {
        let body = format!(
            r#"{{"items":[{{"metadata":{{"name":"attacker-says-this-is-idle",
              "namespace":"attacker-ns","uid":"{UID}"}}}}]}}"#
        );
        let me = cpi_user::fsafe::euid();
        let ask = |port: u16| {
            let mut k = Kubelet::new(&format!("http://127.0.0.1:{port}"));
            let mut id = ProcessIdentity {
                pod_uid: Some(UID.into()),
                ..ProcessIdentity::default()
            };
            let ((), lines) = crate::test_log::capture(|| {
                for _ in 0..3 {
                    k.fill(&mut id);
                    k.refresh();
                }
            });
            let lines: Vec<String> = lines.into_iter().map(|(_, l)| l).collect();
            (id.pod, k.requests(), lines, k)
        };
        let (pod, requests, lines, _) = ask(serve(body.clone(), me));
        assert_eq!(
            pod.as_deref(),
            Some("attacker-says-this-is-idle"),
            "{lines:?}"
        );
        assert_eq!((requests.ok, lines.len()), (4, 0), "{lines:?}");
        if me != 0 {
            eprintln!("not root: no socket of another user to refuse; skipped");
            return;
        }
        let port = serve(body, 65534);
        let (pod, requests, lines, k) = ask(port);
        assert_eq!(pod, None);
        assert_eq!(k.select(&PodSelector::default()), Selection::default());
        assert_eq!(
            requests,
            Requests {
                refused: 4,
                ..Requests::default()
            }
        );
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains(&format!(
                "port {port} is listened on by uid 65534, not root"
            )),
            "{lines:?}"
        );
    }

    #[test]
    fn a_kubelet_over_plain_http_elsewhere_than_loopback_is_refused() {
        let mut k = Kubelet::new("http://10.0.0.1:10255");
        let ((), lines) = crate::test_log::capture(|| k.refresh());
        assert_eq!(k.requests().refused, 1);
        assert!(lines[0].1.contains("proves nothing"), "{lines:?}");
    }

    #[test]
    fn service_account_token_is_read_bounded_and_trimmed() {
        let d = std::env::temp_dir().join(format!("cpi-sa-token-{}", std::process::id()));
        std::fs::write(&d, "eyJhbGciOi.x.y\n").unwrap();
        assert_eq!(token(&d).as_deref(), Some("eyJhbGciOi.x.y"));
        std::fs::write(&d, "\n").unwrap();
        assert_eq!(token(&d), None);
        std::fs::remove_file(&d).unwrap();
        assert_eq!(token(Path::new("/nonexistent/token")), None);
    }
}
