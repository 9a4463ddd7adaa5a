//! Every mapped file of a recording pointed at its local copy, checked against the
//! recorded build-id, with what that said.

use super::*;

/// Points every mapped file at the local copy [`Locator`] finds (checked against the
/// recorded build-id); returns what that said ([`Relocator::finish`]).
pub(super) fn relocate(
    set: &mut SampleSet,
    locator: &Locator,
    build_ids: &BTreeMap<String, String>,
    what: &str,
) -> Result<Said, ImportError> {
    let mut r = Relocator::new(locator, build_ids.clone(), what, None);
    for p in set.processes.values_mut() {
        r.relocate(p.maps.iter_mut().flat_map(|m| m.mappings.iter_mut()))?;
    }
    Ok(r.finish())
}

/// Points recorded mappings at the local copies of their files, each recorded path
/// located once however many processes (or passes) map it; a note per binary read from
/// another path, and one for those not usable here (not found, another build), each
/// named with its reason at `-v` ([`Relocator::finish`]). The files of a recording
/// from another architecture are not opened: their code is not x86-64.
pub(super) struct Relocator<'a> {
    locator: &'a Locator,
    build_ids: BTreeMap<String, String>,
    what: &'a str,
    /// The recording's architecture when it is not x86-64 ([`perf_data::Header::foreign_arch`]).
    foreign: Option<String>,
    found: BTreeMap<String, Option<(PathBuf, crate::fsafe::FileId)>>,
    other_builds: std::collections::BTreeSet<String>,
    ids: BTreeMap<PathBuf, Option<(Option<String>, crate::fsafe::FileId)>>,
    notes: Vec<String>,
    /// Recorded files not usable here, each with why.
    missing: Vec<(String, String)>,
    /// Recorded files of another architecture, not opened.
    not_read: std::collections::BTreeSet<String>,
}

/// What relocating said: warnings, what `-v` adds, and the files it named unusable
/// (for the analysis not to name them again, [`crate::binary::SymbolizerOptions::said`]).
#[derive(Clone, Debug, Default)]
pub(super) struct Said {
    pub(super) notes: Vec<String>,
    pub(super) details: Vec<String>,
    pub(super) files: Vec<PathBuf>,
}

impl<'a> Relocator<'a> {
    pub(super) fn new(
        locator: &'a Locator,
        build_ids: BTreeMap<String, String>,
        what: &'a str,
        foreign: Option<String>,
    ) -> Self {
        Relocator {
            locator,
            build_ids,
            what,
            foreign,
            found: BTreeMap::new(),
            other_builds: std::collections::BTreeSet::new(),
            ids: BTreeMap::new(),
            notes: Vec::new(),
            missing: Vec::new(),
            not_read: std::collections::BTreeSet::new(),
        }
    }

    /// The notes: one line for all the files not usable here (one file: its reason).
    pub(super) fn finish(self) -> Said {
        let mut said = Said {
            notes: self.notes,
            ..Said::default()
        };
        if let Some(arch) = &self.foreign {
            if !self.not_read.is_empty() {
                said.notes.push(format!(
                    "{}: recorded on {arch}, whose code this build does not read (x86-64 \
                     only): its {} mapped files were not opened, their samples counted per \
                     file",
                    self.what,
                    self.not_read.len()
                ));
            }
        }
        said.files = self.missing.iter().map(|(f, _)| PathBuf::from(f)).collect();
        match self.missing.as_slice() {
            [] => {}
            [(_, one)] => said.notes.push(one.clone()),
            all => {
                let names: Vec<String> = all.iter().map(|(f, _)| f.clone()).collect();
                said.notes.push(crate::binary::symbolize::files_summary(
                    "recorded binaries not usable here, their samples unmapped",
                    &names,
                    "; give them with --binary NAME=PATH or --symfs DIR",
                ));
                said.details = all.iter().map(|(_, why)| why.clone()).collect();
            }
        }
        said
    }

    /// Points each file mapping of `maps` (as recorded) at its local copy.
    pub(super) fn relocate<'m>(
        &mut self,
        maps: impl IntoIterator<Item = &'m mut crate::procmap::Mapping>,
    ) -> Result<(), ImportError> {
        let build_ids = &self.build_ids;
        for m in maps {
            let MappedObject::File { path, .. } = &mut m.object else {
                continue;
            };
            let recorded = path.display().to_string();
            if let Some(arch) = &self.foreign {
                m.object =
                    MappedObject::Special(format!("[{}: {arch} code]", file_name(&recorded)));
                self.not_read.insert(recorded);
                continue;
            }
            if !self.found.contains_key(&recorded) {
                let (local, refused, unreadable) = match self.locator.locate(
                    &recorded,
                    build_ids.get(&recorded).map(String::as_str),
                    &mut self.ids,
                ) {
                    Ok(l) => (l, false, false),
                    // This machine's own file at the recorded path (its ld.so, libc) is
                    // another build: not used, said, and the rest imported as perf does.
                    // A file the user named is refused.
                    Err(LocateError::BuildIdMismatch {
                        found: at,
                        want,
                        got,
                        ..
                    }) if at == recorded => {
                        self.missing.push((
                            recorded.clone(),
                            format!(
                                "{recorded}: the file at that path here is another build \
                             (build-id {got}; the recording has {want}): its samples are \
                             unmapped; give the recorded binary with --binary NAME=PATH or \
                             --symfs DIR"
                            ),
                        ));
                        (None, true, false)
                    }
                    // Said, and counted unusable, by the analysis that opens it again.
                    Err(LocateError::NotReadable(_)) => (None, false, true),
                    Err(source) => {
                        return Err(ImportError::Locate {
                            what: self.what.into(),
                            source,
                        })
                    }
                };
                match &local {
                    Some((l, _)) if *l != *path => {
                        self.notes
                            .push(format!("{recorded}: read from {}", l.display()));
                    }
                    None if !refused
                        && !unreadable
                        && (build_ids.contains_key(&recorded) || !path.exists()) =>
                    {
                        let why = format!(
                            "{recorded}: not found on this machine (build-id {}): its samples \
                             are unmapped; give it with --binary NAME=PATH or --symfs DIR",
                            build_ids
                                .get(&recorded)
                                .map(String::as_str)
                                .unwrap_or("unknown")
                        );
                        self.missing.push((recorded.clone(), why));
                    }
                    _ => {}
                }
                if refused {
                    self.other_builds.insert(recorded.clone());
                }
                self.found.insert(recorded.clone(), local);
            }
            if let Some(Some((l, id))) = self.found.get(&recorded) {
                *path = l.clone();
                m.file_id = Some(*id);
            } else if self.other_builds.contains(&recorded) {
                // Named, never opened: its samples count against no function.
                m.object =
                    MappedObject::Special(format!("[{}: another build]", file_name(&recorded)));
            }
        }
        Ok(())
    }
}

/// The file name of a recorded path (the path when it has none).
fn file_name(recorded: &str) -> String {
    Path::new(recorded)
        .file_name()
        .map_or(recorded.to_string(), |n| n.to_string_lossy().into_owned())
}
