//! Call paths cut to a column so that rows stay apart: each keeps its leaf and the
//! frames where it differs from the other rows (compared from the leaf end, where the
//! paths into one function meet), then as many frames next to the leaf as fit; the
//! frames left out read `…`. Cut at the start alone, three paths into `memcmp` through
//! one comparator would read the same (`…0 → func_fc9b0 → __memcmp_avx2_movbe`).

use std::collections::BTreeSet;

use super::{ellipsize, or_unknown, MAX_PATH_CHARS};

/// Frames compared from the leaf end, at most: a path handed over in a file may hold
/// 100 000, and no column shows that many.
const MAX_COMPARED: usize = MAX_PATH_CHARS;

/// One row's path: its process's name when the table covers several, its frames
/// root first.
pub(super) struct PathRow<'a> {
    pub(super) comm: Option<&'a str>,
    pub(super) frames: Vec<&'a str>,
}

impl PathRow<'_> {
    /// The row's items: `comm:` first when there is one, then the frames.
    fn items(&self) -> Vec<String> {
        let comm = self.comm.map(|c| format!("{}:", or_unknown(c)));
        comm.into_iter()
            .chain(self.frames.iter().map(|f| f.to_string()))
            .collect()
    }
}

/// Where `a` differs from `b` counted from the leaf end: the index into `a` of its
/// first frame that `b` lacks at that distance from the leaf (`a`'s root where `a` is
/// a tail of `b`); `None` where they are the same.
fn differs_at(a: &[String], b: &[String]) -> Option<usize> {
    let n = a.len().min(MAX_COMPARED);
    for k in 0..n {
        let (x, y) = (
            &a[a.len() - 1 - k],
            b.len().checked_sub(k + 1).map(|j| &b[j]),
        );
        if y != Some(x) {
            return Some(a.len() - 1 - k);
        }
    }
    (a.len() != b.len()).then_some(a.len().saturating_sub(n))
}

/// The text of `items` with only `kept` shown, gaps written `…`.
fn text(items: &[String], kept: &BTreeSet<usize>) -> String {
    let mut s = String::new();
    let mut next = 0;
    for &i in kept {
        if i > next {
            s.push_str(if next == 0 {
                "… → "
            } else {
                " → … → "
            });
        } else if i > 0 {
            s.push_str(if items[i - 1].ends_with(':') && i == 1 {
                " "
            } else {
                " → "
            });
        }
        s.push_str(&items[i]);
        next = i + 1;
    }
    s
}

/// The width of `items` with `kept` shown (the length of [`text`]).
fn width(items: &[String], kept: &BTreeSet<usize>) -> usize {
    text(items, kept).chars().count()
}

/// Each row's path in at most `max` characters, rows kept apart (module docs): each
/// keeps the frame where it parts from the row closest to it (the longest shared
/// tail); rows that still read alike keep every frame where they part from another.
pub(super) fn distinct_paths(rows: &[PathRow], max: usize) -> Vec<String> {
    let max = max.min(MAX_PATH_CHARS);
    let items: Vec<Vec<String>> = rows.iter().map(PathRow::items).collect();
    let parts = |i: usize| -> Vec<usize> {
        (items.iter().enumerate())
            .filter(|(j, _)| *j != i)
            .filter_map(|(_, other)| differs_at(&items[i], other))
            .collect()
    };
    let leaf = |i: usize| items[i].len().saturating_sub(1);
    let mut out: Vec<String> = (0..items.len())
        .map(|i| {
            let closest = parts(i).into_iter().min();
            fit(
                &items[i],
                closest.into_iter().chain([leaf(i)]).collect(),
                max,
            )
        })
        .collect();
    for i in 0..out.len() {
        if (0..out.len()).any(|j| j != i && out[j] == out[i]) {
            out[i] = fit(
                &items[i],
                parts(i).into_iter().chain([leaf(i)]).collect(),
                max,
            );
        }
    }
    out
}

/// `items` with `kept` and as many frames next to the leaf as fit in `max`; where
/// `kept` alone is too wide, its names shortened ([`shortened`]).
fn fit(items: &[String], mut kept: BTreeSet<usize>, max: usize) -> String {
    if items.is_empty() {
        return String::new();
    }
    let all = width(items, &(0..items.len()).collect());
    if all <= max {
        return text(items, &(0..items.len()).collect());
    }
    if width(items, &kept) > max {
        return shortened(items, &kept, max);
    }
    // Next to the leaf, as far as they fit; then the root if it does.
    for i in (0..items.len()).rev().take(MAX_COMPARED) {
        if kept.insert(i) && width(items, &kept) > max {
            kept.remove(&i);
            kept.insert(0);
            if width(items, &kept) > max {
                kept.remove(&0);
            }
            break;
        }
    }
    text(items, &kept)
}

/// The fewest characters a shortened leaf keeps.
const MIN_LEAF: usize = 8;

/// `kept` too wide for `max`: the leaf shortened first (in `--callers` every row's
/// leaf is the function asked about, named in the title), to [`MIN_LEAF`] at least;
/// then the other names to an equal share of what is left; then the whole cut at the
/// start if still wide.
fn shortened(items: &[String], kept: &BTreeSet<usize>, max: usize) -> String {
    let leaf = items.len() - 1;
    let over = width(items, kept).saturating_sub(max);
    let leaf_len = items[leaf].chars().count();
    let leaf_room = leaf_len.saturating_sub(over).max(MIN_LEAF).min(leaf_len);
    let mut cut: Vec<String> = items.to_vec();
    cut[leaf] = ellipsize(&items[leaf], leaf_room);
    let over = width(&cut, kept).saturating_sub(max);
    if over > 0 {
        let others: Vec<usize> = kept.iter().copied().filter(|&i| i != leaf).collect();
        let names: usize = others.iter().map(|&i| cut[i].chars().count()).sum();
        let each = (names.saturating_sub(over) / others.len().max(1)).max(4);
        for i in others {
            cut[i] = ellipsize(&cut[i], each);
        }
    }
    ellipsize_left(&text(&cut, kept), max)
}

/// `s` in at most `max` characters, cut at the start ("…b → leaf"): the leaf end of a
/// path says most.
fn ellipsize_left(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let mut t = String::from("…");
    t.extend(s.chars().skip(n - max.saturating_sub(1)));
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(frames: &'a str) -> PathRow<'a> {
        PathRow {
            comm: None,
            frames: frames.split(' ').collect(),
        }
    }

    /// Three paths into memcmp through one comparator, apart only near the root: each
    /// keeps its leaf and the frame where it parts from the others.
    #[test]
    fn paths_that_meet_at_the_leaf_stay_apart() {
        let rows = [
            row("main step exec sort_a merge compare_one func_fc9b0 memcmp"),
            row("main step exec sort_b merge compare_one func_fc9b0 memcmp"),
            row("main step exec insert_c merge compare_one func_fc9b0 memcmp"),
        ];
        let out = distinct_paths(&rows, 44);
        assert_eq!(out.iter().collect::<BTreeSet<_>>().len(), 3, "{out:?}");
        for (o, mid) in out.iter().zip(["sort_a", "sort_b", "insert_c"]) {
            assert!(o.chars().count() <= 44, "{o}");
            assert!(o.ends_with("func_fc9b0 → memcmp"), "{o}");
            assert!(o.contains(mid) && o.contains('…'), "{o}");
        }
        // Wide enough: whole.
        let whole = distinct_paths(&rows[..1], 200);
        assert_eq!(
            whole[0],
            "main → step → exec → sort_a → merge → compare_one → func_fc9b0 → memcmp"
        );
        // A path that is the tail of another keeps its root.
        let out = distinct_paths(&[row("a b c d e f"), row("c d e f")], 12);
        assert_ne!(out[0], out[1], "{out:?}");
        // Too narrow for the frames that part them: shortened, still within the width.
        let out = distinct_paths(&rows, 20);
        assert!(out.iter().all(|o| o.chars().count() <= 20), "{out:?}");
    }

    #[test]
    fn the_process_name_leads_and_a_lone_path_keeps_its_leaf_end() {
        let rows = [PathRow {
            comm: Some("cc1"),
            frames: vec!["main", "toplev", "compile", "expand"],
        }];
        assert_eq!(
            distinct_paths(&rows, 80)[0],
            "cc1: main → toplev → compile → expand"
        );
        assert_eq!(distinct_paths(&rows, 24)[0], "… → compile → expand");
    }
}
