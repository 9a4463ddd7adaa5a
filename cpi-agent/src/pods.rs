//! The agent's Kubernetes selectors (`--pod`, `--namespace`, `--container`): the pods of
//! the kubelet's list (cpi-agent/src/kubelet.rs) that match, and their cgroup v2
//! directories, found in the forms the identity parser reads
//! (cpi-user/src/procmap/cgroup.rs `pod_dirs`) below the kubelet's pods cgroup wherever
//! it is ([`kubepods_dirs`]: at the top, or below a `--cgroup-root` or a node that is a
//! container, as kind's), which the kernel filter keeps
//! (cpi-user/src/collect/filter.rs). Pods come and go: the selection is made again at
//! every kubelet refresh ([`super::kubelet::REFRESH`]) and the filter's cgroups replaced, so a
//! pod that appears is sampled from the next refresh on and one that goes leaves the
//! filter. Bounded: at most `MAX_FILTER_CGROUPS` cgroups, [`MAX_POD_CHILDREN`] entries
//! of a pod's directory read when looking for a container's.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cpi_common::wire::MAX_FILTER_CGROUPS;

use super::kubelet::Kubelet;
use cpi_user::collect::filter::CgroupV2;
use cpi_user::procmap::{is_kubepods, pod_dirs, ProcessIdentity};

/// Entries of a pod's cgroup directory looked at for its containers' at most (a pod
/// has a few containers; the rest of its entries are the cgroup's own files).
pub(crate) const MAX_POD_CHILDREN: usize = 256;

/// How deep below the cgroup v2 mount the kubelet's pods cgroup is looked for: kind's,
/// seen from the host, is `system.slice/docker-<NODE>.scope/kubelet.slice/kubelet-kubepods.slice`.
const KUBEPODS_DEPTH: usize = 4;

/// Directories read at most, and entries of each, while looking for it (a host has
/// a few hundred cgroups; the bound keeps a cgroup tree someone filled cheap).
const MAX_SCANNED_DIRS: usize = 4096;
const MAX_SCANNED_ENTRIES: usize = 1024;

/// Which pods to sample; a part not given matches any pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSelector {
    /// The pod's name.
    pub pod: Option<String>,
    /// The pod's namespace.
    pub namespace: Option<String>,
    /// A container's name: only that container of each pod.
    pub container: Option<String>,
}

impl PodSelector {
    /// True when no part is given: nothing is selected by pod.
    pub fn is_empty(&self) -> bool {
        self.pod.is_none() && self.namespace.is_none() && self.container.is_none()
    }

    /// The selector in the flags' words (`--namespace shop --pod web-1`).
    pub fn describe(&self) -> String {
        [
            ("namespace", &self.namespace),
            ("pod", &self.pod),
            ("container", &self.container),
        ]
        .iter()
        .filter_map(|(k, v)| Some(format!("--{k} {}", v.as_deref()?)))
        .collect::<Vec<_>>()
        .join(" ")
    }
}

/// The pods a selector chooses, by UID, each with the ids of the containers chosen
/// (`None`: the whole pod).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Selection(pub HashMap<String, Option<Vec<String>>>);

impl Selection {
    /// Whether a process of this identity is in a chosen pod (and container).
    pub fn matches(&self, id: &ProcessIdentity) -> bool {
        let Some(chosen) = id.pod_uid.as_ref().and_then(|u| self.0.get(u)) else {
            return false;
        };
        match (chosen, &id.container_id) {
            (None, _) => true,
            (Some(ids), Some(c)) => ids.contains(c),
            (Some(_), None) => false,
        }
    }

    /// The cgroup directories of the chosen pods (or containers) below the kubelet's pods
    /// cgroups `kubepods` ([`kubepods_dirs`]), those that exist now, at most
    /// `MAX_FILTER_CGROUPS`, in id order; and how many chosen pods have none.
    pub fn cgroups(&self, kubepods: &[PathBuf]) -> (Vec<CgroupV2>, usize) {
        let (mut out, mut missing) = (Vec::new(), 0);
        for (uid, containers) in &self.0 {
            let Some(pod) = kubepods
                .iter()
                .filter_map(|k| {
                    let name = k.file_name()?.to_str()?;
                    Some(pod_dirs(name, uid)?.map(|d| k.join(d)))
                })
                .flatten()
                .find(|d| d.is_dir())
            else {
                missing += 1;
                continue;
            };
            match containers {
                None => out.extend(CgroupV2::at(&pod).ok()),
                Some(ids) => {
                    out.extend(container_dirs(&pod, ids).filter_map(|d| CgroupV2::at(&d).ok()))
                }
            }
        }
        out.sort_by_key(|g| g.id);
        out.dedup_by_key(|g| g.id);
        out.truncate(MAX_FILTER_CGROUPS as usize);
        (out, missing)
    }
}

/// The kubelet's pods cgroups under the cgroup v2 mount `root`, shallowest first, at
/// most [`KUBEPODS_DEPTH`] down. Only directories owned by root (or by the agent's user)
/// count, and none is looked into: a user with a delegated cgroup subtree
/// (`user@UID.service`) can make a `kubepods.slice` of their own, but not as root, so
/// their processes never pass for a selected pod.
pub(crate) fn kubepods_dirs(root: &Path) -> Vec<PathBuf> {
    let me = cpi_user::fsafe::euid();
    let trusted = |d: &Path| {
        std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir() && (m.uid() == 0 || m.uid() == me))
    };
    let (mut found, mut level, mut scanned) = (Vec::new(), vec![root.to_path_buf()], 0);
    for _ in 0..KUBEPODS_DEPTH {
        let mut next = Vec::new();
        for dir in level {
            if scanned == MAX_SCANNED_DIRS {
                break;
            }
            scanned += 1;
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.take(MAX_SCANNED_ENTRIES).flatten() {
                // The entry's own type: a link is never followed.
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let path = e.path();
                if is_kubepods(&e.file_name().to_string_lossy()) {
                    if trusted(&path) {
                        found.push(path);
                    }
                } else {
                    next.push(path);
                }
            }
        }
        level = next;
    }
    found
}

/// The directories below a pod's whose names carry one of `ids` (any runtime's form).
fn container_dirs<'a>(pod: &'a Path, ids: &'a [String]) -> impl Iterator<Item = PathBuf> + 'a {
    std::fs::read_dir(pod)
        .into_iter()
        .flatten()
        .take(MAX_POD_CHILDREN)
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(move |e| {
            let name = format!("/{}", e.file_name().to_string_lossy());
            ProcessIdentity::of_path(&name)
                .container_id
                .is_some_and(|c| ids.contains(&c))
        })
        .map(|e| e.path())
}

/// The selector's cgroups, made again at each kubelet refresh.
pub(crate) struct PodFilter {
    kubelet: Arc<Mutex<Kubelet>>,
    selector: PodSelector,
    root: PathBuf,
    /// The kubelet's pods cgroups last found under `root`: looked for again only when a
    /// chosen pod is not below them.
    kubepods: Vec<PathBuf>,
    /// The ids last handed out; `None` before the first.
    current: Option<Vec<u64>>,
}

impl PodFilter {
    /// The filter of `selector`'s pods, whose cgroups are under the cgroup v2 mount
    /// `root`, named by `kubelet` (shared with the analysis, which names processes).
    pub fn new(kubelet: Arc<Mutex<Kubelet>>, selector: PodSelector, root: PathBuf) -> PodFilter {
        PodFilter {
            kubelet,
            selector,
            root,
            kubepods: Vec::new(),
            current: None,
        }
    }

    /// Fetches the pod list and selects again: the new set of cgroups when it changed
    /// (first call: always). Logs a line when the selection becomes empty (nothing is
    /// sampled until a pod appears) and when it is no longer.
    pub fn refresh(&mut self) -> Option<Vec<CgroupV2>> {
        let selection = {
            let mut k = super::lock(&self.kubelet);
            k.refresh();
            k.select(&self.selector)
        };
        let (mut set, missing) = selection.cgroups(&self.kubepods);
        if missing > 0 {
            self.kubepods = kubepods_dirs(&self.root);
            set = selection.cgroups(&self.kubepods).0;
        }
        let ids: Vec<u64> = set.iter().map(|g| g.id).collect();
        if self.current.as_ref() == Some(&ids) {
            return None;
        }
        let was_empty = self.current.as_ref().is_none_or(Vec::is_empty);
        let what = self.selector.describe();
        if ids.is_empty() {
            let pods = selection.0.len();
            if pods == 0 {
                log::warn!(
                    "{what}: no such pod on this node (yet): nothing is sampled until one \
                     appears"
                );
            } else {
                log::warn!(
                    "{what}: no cgroup under {} of the pods that match ({pods}) (yet): \
                     nothing is sampled until one appears",
                    self.root.display()
                );
            }
        } else if was_empty || ids.len() >= MAX_FILTER_CGROUPS as usize {
            log::info!(
                "{what}: sampling {} (pods matched: {}){}",
                match ids.len() {
                    1 => "1 cgroup".to_string(),
                    n => format!("{n} cgroups"),
                },
                selection.0.len(),
                if ids.len() >= MAX_FILTER_CGROUPS as usize {
                    "; the kernel filter holds no more: the rest are not sampled"
                } else {
                    ""
                }
            );
        }
        self.current = Some(ids);
        Some(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "74c13223-5a00-11e9-b385-42010a80018d";
    const ID: &str = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d";

    #[test]
    fn a_process_matches_by_pod_uid_and_chosen_container() {
        let id = |uid: &str, c: Option<&str>| ProcessIdentity {
            pod_uid: Some(uid.into()),
            container_id: c.map(str::to_string),
            ..ProcessIdentity::default()
        };
        let whole = Selection([(UID.to_string(), None)].into_iter().collect());
        assert!(whole.matches(&id(UID, None)));
        assert!(whole.matches(&id(UID, Some(ID))));
        assert!(!whole.matches(&id("other", Some(ID))));
        assert!(!whole.matches(&ProcessIdentity::default()));
        let one = Selection(
            [(UID.to_string(), Some(vec![ID.to_string()]))]
                .into_iter()
                .collect(),
        );
        assert!(one.matches(&id(UID, Some(ID))));
        assert!(!one.matches(&id(UID, Some("ab"))));
        // The pod's own cgroup (its pause process) is no chosen container.
        assert!(!one.matches(&id(UID, None)));
        let sel = PodSelector {
            pod: Some("web-1".into()),
            namespace: Some("shop".into()),
            container: None,
        };
        assert_eq!(sel.describe(), "--namespace shop --pod web-1");
        assert!(!sel.is_empty() && PodSelector::default().is_empty());
    }

    /// The kubelet's pods cgroup is found at the top, nested (kind), and not through a
    /// link, below another one, or deeper than the bound; a pod's directory below it.
    #[test]
    fn kubepods_is_found_where_kubelets_put_it() {
        let root = std::env::temp_dir().join(format!("cpi-kubepods-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let top = root.join("kubepods.slice");
        let kind = root.join("system.slice/docker-n.scope/kubelet.slice/kubelet-kubepods.slice");
        let u_ = UID.replace('-', "_");
        let pod = kind.join(format!(
            "kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{u_}.slice"
        ));
        for d in [
            &top.join("kubepods-besteffort.slice/kubepods.slice"),
            &pod,
            &root.join("a/b/c/d/kubepods"),
            &root.join("elsewhere/kubepods"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::os::unix::fs::symlink(root.join("elsewhere"), root.join("system.slice/link")).unwrap();
        let mut found = kubepods_dirs(&root);
        found.sort();
        let mut want = vec![top, kind.clone(), root.join("elsewhere/kubepods")];
        want.sort();
        assert_eq!(found, want);
        let sel = Selection([(UID.to_string(), None)].into_iter().collect());
        let dirs: Vec<PathBuf> = pod_dirs("kubelet-kubepods.slice", UID)
            .unwrap()
            .iter()
            .map(|d| kind.join(d))
            .collect();
        assert_eq!(
            dirs.iter().filter(|d| d.is_dir()).collect::<Vec<_>>(),
            [&pod]
        );
        // Not a cgroup v2 directory here, so no cgroup, but the pod was found.
        assert_eq!(sel.cgroups(&found).1, 0);
        assert_eq!(sel.cgroups(&[]).1, 1);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
