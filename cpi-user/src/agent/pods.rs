//! The agent's Kubernetes selectors (`--pod`, `--namespace`, `--container`): the pods of
//! the kubelet's list (cpi-user/src/agent/kubelet.rs) that match, and their cgroup v2
//! directories, found in the forms the identity parser reads
//! (cpi-user/src/procmap/cgroup.rs `pod_dirs`), which the kernel filter keeps
//! (cpi-user/src/collect/filter.rs). Pods come and go: the selection is made again at
//! every kubelet refresh ([`super::kubelet::REFRESH`]) and the filter's cgroups replaced, so a
//! pod that appears is sampled from the next refresh on and one that goes leaves the
//! filter. Bounded: at most `MAX_FILTER_CGROUPS` cgroups, [`MAX_POD_CHILDREN`] entries
//! of a pod's directory read when looking for a container's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cpi_common::wire::MAX_FILTER_CGROUPS;

use super::kubelet::Kubelet;
use super::Level;
use crate::collect::filter::CgroupV2;
use crate::procmap::{pod_dirs, ProcessIdentity};

/// Entries of a pod's cgroup directory looked at for its containers' at most (a pod
/// has a few containers; the rest of its entries are the cgroup's own files).
pub const MAX_POD_CHILDREN: usize = 256;

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
pub struct Selection(pub HashMap<String, Option<Vec<String>>>);

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

    /// The cgroup directories of the chosen pods (or containers) under the cgroup v2
    /// mount `root`, those that exist now, at most `MAX_FILTER_CGROUPS`, in id order.
    pub fn cgroups(&self, root: &Path) -> Vec<CgroupV2> {
        let mut out = Vec::new();
        for (uid, containers) in &self.0 {
            let Some(pod) = pod_dirs(uid)
                .into_iter()
                .flatten()
                .map(|d| root.join(d))
                .find(|d| d.is_dir())
            else {
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
        out
    }
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
pub struct PodFilter {
    kubelet: Arc<Mutex<Kubelet>>,
    selector: PodSelector,
    root: PathBuf,
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
            current: None,
        }
    }

    /// Fetches the pod list and selects again: the new set of cgroups when it changed
    /// (first call: always). `log` gets a line when the selection becomes empty
    /// (nothing is sampled until a pod appears) and when it is no longer.
    pub fn refresh(&mut self, log: &dyn Fn(Level, &str)) -> Option<Vec<CgroupV2>> {
        let selection = {
            let mut k = super::lock(&self.kubelet);
            k.refresh(log);
            k.select(&self.selector)
        };
        let set = selection.cgroups(&self.root);
        let ids: Vec<u64> = set.iter().map(|g| g.id).collect();
        if self.current.as_ref() == Some(&ids) {
            return None;
        }
        let was_empty = self.current.as_ref().is_none_or(Vec::is_empty);
        let what = self.selector.describe();
        if ids.is_empty() {
            let pods = selection.0.len();
            log(
                Level::Warn,
                &if pods == 0 {
                    format!(
                        "{what}: no such pod on this node (yet): nothing is sampled until \
                         one appears"
                    )
                } else {
                    format!(
                        "{what}: no cgroup under {} of the pods that match ({pods}) (yet): \
                         nothing is sampled until one appears",
                        self.root.display()
                    )
                },
            );
        } else if was_empty || ids.len() >= MAX_FILTER_CGROUPS as usize {
            log(
                Level::Info,
                &format!(
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
                ),
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
}
