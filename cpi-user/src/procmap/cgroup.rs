//! Who a process is: its cgroup path (`/proc/PID/cgroup`) and what the path names — the
//! container id, the Kubernetes pod UID and QoS class — plus, where a kubelet answers
//! (cpi-agent/src/kubelet.rs), the pod's name, namespace and container name.
//!
//! The path forms recognised, and where each was seen:
//! - systemd cgroup driver, Kubernetes:
//!   `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID_with_underscores>.slice/cri-containerd-<ID>.scope`
//!   (`crio-<ID>.scope` for CRI-O, `docker-<ID>.scope` for dockershim; guaranteed pods sit
//!   directly in `kubepods.slice/kubepods-pod<UID>.slice`): the comment on Kubernetes' two
//!   cgroup drivers in a Rust container-metadata module found by the `search` tool, and
//!   CJLove/rt-operator `notes/cgroupv1_notes.md` (docker and cri-o runtimes).
//! - cgroupfs driver, Kubernetes: `/kubepods/besteffort/pod<UID>/<ID>` (Qard/container-info
//!   `test/fixtures/result.js`; k3s's `/kubepods/pod<UID>/<ID>` for guaranteed pods in
//!   CJLove/rt-operator's notes).
//! - Either, below another cgroup: a kubelet with `--cgroup-root` (kind's nodes run theirs
//!   with `/kubelet`, so the systemd driver makes `kubelet.slice/kubelet-kubepods.slice/
//!   kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod<UID_>.slice`: the
//!   prefix joins every slice name), and a node that is itself a container (kind's nodes,
//!   seen from the host: `/system.slice/docker-<NODE>.scope/kubelet.slice/…`). Not checked
//!   against a stored source: the naming follows the systemd driver's rule that a slice
//!   `a-b.slice` is the child of `a.slice`.
//! - Docker without Kubernetes: `/docker/<ID>` (cgroupfs) and
//!   `/system.slice/docker-<ID>.scope` (systemd): neuvector/neuvector
//!   `share/system/cgroup_test.go`.
//! - Podman: `libpod-<ID>.scope` under `machine.slice` or a user slice, its monitor in
//!   `libpod-conmon-<ID>.scope` (podman's systemd cgroup manager; not checked against a
//!   stored source).
//!
//! On a hybrid host (v1 controllers beside the unified `0::` line) the unified path is
//! preferred; when it names no container but a v1 line does (`name=systemd`, `memory`: a
//! runtime that only uses v1), that line's path is taken.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Bytes of `/proc/PID/cgroup` read at most (a line per v1 hierarchy; paths are short).
const MAX_CGROUP_FILE: u64 = 64 * 1024;

/// What is known of a process's place on the host; every field is absent when unknown
/// (a plain host gives the cgroup path only). Kept raw: escaped where shown
/// (cpi-user/src/fsafe/text.rs).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessIdentity {
    /// The cgroup path, relative to the hierarchy's root (`/system.slice/x.service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The container's id (64 hex digits for docker, containerd, CRI-O and podman).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The Kubernetes pod's UID (dashed UUID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The pod's QoS class: `guaranteed`, `burstable` or `besteffort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// The pod's name (from the kubelet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pod's namespace (from the kubelet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The container's name in its pod (from the kubelet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

impl ProcessIdentity {
    /// The identity of the process whose `/proc/PID/cgroup` reads `text`; `None` when no
    /// line carries a path.
    pub fn parse(text: &str) -> Option<ProcessIdentity> {
        // (hierarchy id, controllers, path) per line; the path may itself hold ':'.
        let lines: Vec<(&str, &str, &str)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.splitn(3, ':');
                Some((it.next()?, it.next()?, it.next()?.trim()))
            })
            .filter(|(_, _, p)| p.starts_with('/'))
            .collect();
        let unified = lines.iter().find(|(id, c, _)| *id == "0" && c.is_empty());
        let v1 = |name: &str| {
            lines
                .iter()
                .find(|(_, c, _)| c.split(',').any(|x| x == name))
        };
        let candidates = [unified, v1("name=systemd"), v1("memory")];
        let mut first = None;
        for (_, _, path) in candidates.into_iter().flatten() {
            let id = Self::of_path(path);
            if id.container_id.is_some() || id.pod_uid.is_some() {
                return Some(id);
            }
            first.get_or_insert(id);
        }
        first.or_else(|| lines.first().map(|(_, _, p)| Self::of_path(p)))
    }

    /// What a cgroup path names.
    pub fn of_path(path: &str) -> ProcessIdentity {
        let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let kube = parts.iter().position(|p| is_kubepods(p));
        let mut id = ProcessIdentity {
            cgroup: Some(path.to_string()),
            container_id: parts.iter().rev().find_map(|p| container_id(p)),
            ..ProcessIdentity::default()
        };
        if let Some(k) = kube {
            let below = &parts[k + 1..];
            id.pod_uid = below.iter().find_map(|p| pod_uid(p));
            if id.pod_uid.is_some() {
                id.qos = Some(qos(below.first().copied().unwrap_or("")).to_string());
            }
        }
        id
    }

    /// The known fields as (name, value), named as in the profile file: pprof sample
    /// labels (cpi-user/src/report/pprof.rs).
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("cgroup", &self.cgroup),
            ("container_id", &self.container_id),
            ("pod_uid", &self.pod_uid),
            ("qos", &self.qos),
            ("pod", &self.pod),
            ("namespace", &self.namespace),
            ("container", &self.container),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_deref()?)))
    }

    /// Every field, known or not, to change in place (escaped for a terminal).
    pub(crate) fn strings_mut(&mut self) -> impl Iterator<Item = &mut Option<String>> {
        [
            &mut self.cgroup,
            &mut self.container_id,
            &mut self.pod_uid,
            &mut self.qos,
            &mut self.pod,
            &mut self.namespace,
            &mut self.container,
        ]
        .into_iter()
    }

    /// The identity of process `pid`, read from `/proc/PID/cgroup` through the bounded
    /// reader for files others control (cpi-user/src/fsafe/mod.rs); `None` when it is
    /// gone. With it, whether every process of the same cgroup v2 has this identity:
    /// true when the file holds the unified hierarchy's line alone (a cgroup v2 host),
    /// so the path is all the identity comes from. On a hybrid host a v1 line can name
    /// a container that the unified path does not.
    pub fn read(pid: u32) -> Option<(ProcessIdentity, bool)> {
        let path = format!("/proc/{pid}/cgroup");
        let bytes = crate::fsafe::read_bounded(Path::new(&path), MAX_CGROUP_FILE).ok()?;
        let text = String::from_utf8_lossy(&bytes);
        Some((Self::parse(&text)?, unified_only(&text)))
    }
}

/// Whether a `/proc/PID/cgroup` text holds the unified hierarchy's line alone.
fn unified_only(text: &str) -> bool {
    text.starts_with("0::/") && text.lines().count() == 1
}

/// Whether a path component is the kubelet's pods cgroup: `kubepods` (cgroupfs driver),
/// `kubepods.slice` (systemd driver), or `<root>-kubepods.slice` (systemd driver under a
/// `--cgroup-root`).
pub fn is_kubepods(part: &str) -> bool {
    part == "kubepods" || part == "kubepods.slice" || part.ends_with("-kubepods.slice")
}

/// The cgroup directories pod `uid` can have, relative to the kubelet's pods cgroup
/// named `kubepods` (one that [`is_kubepods`]), one per QoS class in the forms
/// [`ProcessIdentity::of_path`] reads (a pod has one of them): the agent's pod selectors
/// look them up (cpi-agent/src/pods.rs). `None` when `uid` is no UUID (it comes from
/// the kubelet: never a path of its choosing) or `kubepods` is no pods cgroup.
pub fn pod_dirs(kubepods: &str, uid: &str) -> Option<[String; 3]> {
    if !is_uuid(uid) || !is_kubepods(kubepods) {
        return None;
    }
    Some(match kubepods.strip_suffix(".slice") {
        // systemd: each slice's name is its parent's plus `-<name>`.
        Some(p) => {
            let u_ = uid.replace('-', "_");
            [
                format!("{p}-pod{u_}.slice"),
                format!("{p}-burstable.slice/{p}-burstable-pod{u_}.slice"),
                format!("{p}-besteffort.slice/{p}-besteffort-pod{u_}.slice"),
            ]
        }
        None => [
            format!("pod{uid}"),
            format!("burstable/pod{uid}"),
            format!("besteffort/pod{uid}"),
        ],
    })
}

/// The QoS class of a pod whose path below `kubepods` starts with `first`: burstable and
/// best-effort pods have their own parent, guaranteed pods sit directly in `kubepods`.
fn qos(first: &str) -> &'static str {
    let name = first.trim_end_matches(".slice");
    let name = name.rsplit_once("kubepods-").map_or(name, |(_, q)| q);
    match name {
        "burstable" => "burstable",
        "besteffort" => "besteffort",
        _ => "guaranteed",
    }
}

/// A pod's UID from one path component: `kubepods-<qos>-pod<UID_with_underscores>.slice`
/// or `kubepods-pod<UID>.slice` (systemd driver), `pod<UID>` (cgroupfs driver).
fn pod_uid(part: &str) -> Option<String> {
    let uid = match part.strip_suffix(".slice") {
        Some(slice) => slice.rsplit_once("-pod")?.1.replace('_', "-"),
        None => part.strip_prefix("pod")?.to_string(),
    };
    is_uuid(&uid).then_some(uid)
}

fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A container's id from one path component: `<runtime>-<ID>.scope` (systemd driver;
/// runtimes docker, cri-containerd, crio, libpod), `<runtime>-<ID>` or a bare `<ID>`
/// (cgroupfs driver). Monitors (`crio-conmon-`, `libpod-conmon-`) are not containers.
fn container_id(part: &str) -> Option<String> {
    let name = part.strip_suffix(".scope").unwrap_or(part);
    let id = [
        "docker-",
        "cri-containerd-",
        "crio-",
        "libpod-",
        "containerd-",
    ]
    .iter()
    .find_map(|p| name.strip_prefix(p))
    .unwrap_or(name);
    (id.len() == 64 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d";
    const UID: &str = "74c13223-5a00-11e9-b385-42010a80018d";
    const UID_: &str = "74c13223_5a00_11e9_b385_42010a80018d";
    const NODE: &str = "5f1e3a7c0d2b4e6f8a9c1b3d5e7f9a0c2b4d6e8f0a1c3e5f7b9d1a3c5e7f9b1d";

    fn id(
        cgroup: &str,
        container: Option<&str>,
        pod: Option<&str>,
        qos: Option<&str>,
    ) -> ProcessIdentity {
        ProcessIdentity {
            cgroup: Some(cgroup.to_string()),
            container_id: container.map(str::to_string),
            pod_uid: pod.map(str::to_string),
            qos: qos.map(str::to_string),
            ..ProcessIdentity::default()
        }
    }

    #[test]
    fn path_forms() {
        // (path, container id, pod UID, QoS)
        type Case<'a> = (String, Option<&'a str>, Option<&'a str>, Option<&'a str>);
        let cases: Vec<Case> = vec![
            // systemd driver, containerd, burstable (the form a kind cluster's pods take).
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"),
                Some(ID), Some(UID), Some("burstable"),
            ),
            // systemd driver, CRI-O, best effort.
            (
                format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope"),
                Some(ID), Some(UID), Some("besteffort"),
            ),
            // systemd driver, dockershim, guaranteed (directly under kubepods.slice).
            (
                format!("/kubepods.slice/kubepods-pod{UID_}.slice/docker-{ID}.scope"),
                Some(ID), Some(UID), Some("guaranteed"),
            ),
            // CRI-O's monitor is no container; the pod is still known.
            (
                format!("/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope"),
                None, Some(UID), Some("guaranteed"),
            ),
            // A pod's own cgroup (its pause process, or a process moved there).
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"),
                None, Some(UID), Some("burstable"),
            ),
            // cgroupfs driver.
            (format!("/kubepods/besteffort/pod{UID}/{ID}"), Some(ID), Some(UID), Some("besteffort")),
            (format!("/kubepods/burstable/pod{UID}/{ID}"), Some(ID), Some(UID), Some("burstable")),
            (format!("/kubepods/pod{UID}/{ID}"), Some(ID), Some(UID), Some("guaranteed")),
            // A kubelet with --cgroup-root=/kubelet on a node that is a container (kind),
            // from the host: systemd and cgroupfs drivers.
            (
                format!("/system.slice/docker-{NODE}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"),
                Some(ID), Some(UID), Some("besteffort"),
            ),
            (
                format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"),
                Some(ID), Some(UID), Some("guaranteed"),
            ),
            (format!("/kubelet/kubepods/burstable/pod{UID}/{ID}"), Some(ID), Some(UID), Some("burstable")),
            // Docker without Kubernetes.
            (format!("/docker/{ID}"), Some(ID), None, None),
            (format!("/system.slice/docker-{ID}.scope"), Some(ID), None, None),
            // Podman, root and rootless; its monitor is no container.
            (format!("/machine.slice/libpod-{ID}.scope"), Some(ID), None, None),
            (
                format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"),
                Some(ID), None, None,
            ),
            (format!("/machine.slice/libpod-conmon-{ID}.scope"), None, None, None),
            // Plain host: the path only.
            ("/system.slice/ssh.service".into(), None, None, None),
            ("/user.slice/user-0.slice/session-3.scope".into(), None, None, None),
            ("/".into(), None, None, None),
            // Near misses: a short id, upper-case hex, a pod without a UUID.
            (format!("/docker/{}", &ID[..12]), None, None, None),
            (format!("/docker/{}", ID.to_uppercase()), None, None, None),
            ("/kubepods/burstable/podnot-a-uid/x".into(), None, None, None),
        ];
        for (path, c, p, q) in cases {
            assert_eq!(
                ProcessIdentity::of_path(&path),
                id(&path, c, p, q),
                "{path}"
            );
        }
    }

    #[test]
    fn pod_dirs_are_the_forms_read() {
        assert_eq!(pod_dirs("kubepods.slice", "../../system.slice"), None);
        assert_eq!(pod_dirs("system.slice", UID), None);
        for (kubepods, parent) in [
            ("kubepods.slice", ""),
            ("kubepods", ""),
            ("kubelet-kubepods.slice", "kubelet.slice/"),
            ("kubepods", "kubelet/"),
        ] {
            let dirs = pod_dirs(kubepods, UID).unwrap();
            for (d, q) in dirs.iter().zip(["guaranteed", "burstable", "besteffort"]) {
                let path = format!("/{parent}{kubepods}/{d}");
                let got = ProcessIdentity::of_path(&path);
                assert_eq!(
                    (got.pod_uid.as_deref(), got.qos.as_deref()),
                    (Some(UID), Some(q)),
                    "{path}"
                );
            }
        }
        let dirs = pod_dirs("kubelet-kubepods.slice", UID).unwrap();
        assert_eq!(
            dirs[2],
            format!(
                "kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice"
            )
        );
    }

    #[test]
    fn unified_line_is_preferred_then_a_v1_line_naming_a_container() {
        let k8s = format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope");
        // Pure v2.
        let v2 = format!("0::{k8s}\n");
        assert_eq!(
            ProcessIdentity::parse(&v2).unwrap().container_id.as_deref(),
            Some(ID)
        );
        // Hybrid, the container in the unified hierarchy too.
        let hybrid = format!("4:memory:/elsewhere\n1:name=systemd:/x\n0::{k8s}\n");
        assert_eq!(
            ProcessIdentity::parse(&hybrid).unwrap().cgroup.as_deref(),
            Some(k8s.as_str())
        );
        // Hybrid, the runtime only in v1 (unified at the root): the v1 path.
        let v1 = format!("9:name=systemd:{k8s}\n4:memory:{k8s}\n0::/\n");
        let got = ProcessIdentity::parse(&v1).unwrap();
        assert_eq!(
            (got.cgroup.as_deref(), got.pod_uid.as_deref()),
            (Some(k8s.as_str()), Some(UID))
        );
        // Pure v1, docker cgroupfs (neuvector's Debian fixture form).
        let docker = format!("4:memory:/{ID}\n2:cpu:/{ID}\n");
        assert_eq!(
            ProcessIdentity::parse(&docker)
                .unwrap()
                .container_id
                .as_deref(),
            Some(ID)
        );
        // Plain hybrid host (this machine): the unified path.
        let plain = "9:name=systemd:/\n4:memory:/process_api/508b\n0::/system.slice/x.service\n";
        assert_eq!(
            ProcessIdentity::parse(plain).unwrap(),
            id("/system.slice/x.service", None, None, None)
        );
        // Nothing usable.
        assert_eq!(ProcessIdentity::parse(""), None);
        assert_eq!(ProcessIdentity::parse("garbage\n\u{1b}[2J"), None);
    }

    /// Only a cgroup v2 host's file (the unified line alone) names every process of a
    /// cgroup v2 alike: on a hybrid host a v1 line can hold a container the unified path
    /// does not (the collector's cache by cgroup id, cpi-user/src/collect/processes.rs).
    #[test]
    fn only_the_unified_line_alone_is_shared_by_a_cgroup() {
        assert!(unified_only("0::/system.slice/docker-ab.scope\n"));
        assert!(unified_only("0::/"));
        let hybrid = "12:memory:/docker/ab\n1:name=systemd:/docker/ab\n0::/system.slice/x\n";
        assert!(!unified_only(hybrid));
        assert!(!unified_only("1:name=systemd:/docker/ab\n"));
        assert!(!unified_only(""));
    }

    #[test]
    fn reads_this_process() {
        let (me, _) = ProcessIdentity::read(std::process::id()).expect("own /proc/self/cgroup");
        assert!(me.cgroup.is_some_and(|p| p.starts_with('/')));
        assert_eq!(ProcessIdentity::read(u32::MAX), None);
    }
}
