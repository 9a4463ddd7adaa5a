//! Call stacks interned as ids in a trie, for [`super::stack::StackAggregate`].
//!
//! A node is a stack: its parent is the stack less its leaf frame, keyed by
//! `(parent id, frame)`, so looking a stack up costs a lookup per frame with keys held
//! in the table's slots, and the stack a branch sample's range ran under (its leaf
//! replaced, a call or return undone) costs one lookup from a node at hand. Comparing
//! whole boxed stacks was 55 % of aggregating a branch sample (BENCHMARKS.md, "PMU
//! model / aggregation").
//!
//! From a root per [`StackEnd`] (the stack with no frames) come the kernel frames,
//! outermost first, then the user frames, outermost first: a stack's leaf is its
//! deepest node. Kernel edges carry [`KERNEL`] in their key's parent, so a kernel
//! frame and a user frame of one address under one node are different stacks.

use super::stack::{CallStack, StackEnd};
use super::FastMap;

/// Marks an edge to a kernel frame in a key's parent id; ids stay below it.
const KERNEL: u32 = 1 << 31;
/// No node (a root's parent, a node without a payload).
pub(crate) const NONE: u32 = u32::MAX;

/// Estimated bytes of one node: its entry, and its table slot (key and id, 1.5× for the
/// control byte and load slack).
pub(crate) const NODE_BYTES: usize = size_of::<Node>() + size_of::<((u32, u64), u32)>() * 3 / 2;

#[derive(Clone, Copy, Debug)]
struct Node {
    /// The parent's id, with [`KERNEL`] when this node's frame is a kernel frame;
    /// [`NONE`] for a root.
    parent: u32,
    /// The holder's index for the node ([`NONE`] when it has none).
    payload: u32,
    /// The frame (a root's: its [`StackEnd`]).
    frame: u64,
}

/// The trie; ids are indices, parents before their children.
#[derive(Clone, Debug, Default)]
pub(crate) struct StackTrie {
    nodes: Vec<Node>,
    children: FastMap<(u32, u64), u32>,
    roots: [Option<u32>; 4],
}

impl StackTrie {
    /// Nodes held.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn payload(&self, id: u32) -> u32 {
        self.nodes[id as usize].payload
    }

    pub(crate) fn set_payload(&mut self, id: u32, payload: u32) {
        self.nodes[id as usize].payload = payload;
    }

    /// The user stack less its leaf: `None` at a root or a kernel frame.
    pub(crate) fn user_parent(&self, id: u32) -> Option<u32> {
        let p = self.nodes[id as usize].parent;
        (p & KERNEL == 0).then_some(p)
    }

    /// The edge that reaches node `id` (its parent's id, with [`KERNEL`] for a kernel
    /// frame, and its frame), which names the node uniquely; `None` for a root.
    pub(crate) fn edge(&self, id: u32) -> Option<(u32, u64)> {
        let n = self.nodes[id as usize];
        (n.parent != NONE).then_some((n.parent, n.frame))
    }

    fn push(&mut self, parent: u32, frame: u64) -> u32 {
        let id = self.nodes.len();
        // 2³¹ nodes would take over 100 GiB, far past any stack bound.
        assert!(id < KERNEL as usize, "stack trie full");
        self.nodes.push(Node {
            parent,
            payload: NONE,
            frame,
        });
        id as u32
    }

    /// The root of stacks ending `end`, added when new (the count of nodes added).
    pub(crate) fn root(&mut self, end: StackEnd, added: &mut usize) -> u32 {
        if let Some(id) = self.roots[end as usize] {
            return id;
        }
        *added += 1;
        let id = self.push(NONE, end as u64);
        self.roots[end as usize] = Some(id);
        id
    }

    /// The stack `edge` with `frame` pushed as its leaf, added when new: `edge` is the
    /// parent's id, with [`KERNEL`] when `frame` is a kernel frame.
    pub(crate) fn child(&mut self, edge: u32, frame: u64, added: &mut usize) -> u32 {
        if let Some(&id) = self.children.get(&(edge, frame)) {
            return id;
        }
        *added += 1;
        let id = self.push(edge, frame);
        self.children.insert((edge, frame), id);
        id
    }

    /// The node of `stack`'s kernel frames under its end's root.
    pub(crate) fn kernel_base(&mut self, stack: &CallStack, added: &mut usize) -> u32 {
        let mut at = self.root(stack.end, added);
        for &f in stack.kernel.iter().rev() {
            at = self.child(at | KERNEL, f, added);
        }
        at
    }

    /// `base` with `user` (leaf first) pushed, outermost first.
    pub(crate) fn push_user(&mut self, base: u32, user: &[u64], added: &mut usize) -> u32 {
        user.iter()
            .rev()
            .fold(base, |at, &f| self.child(at, f, added))
    }

    /// The node of `stack`, if it is held.
    pub(crate) fn find(&self, stack: &CallStack) -> Option<u32> {
        let mut at = self.roots[stack.end as usize]?;
        for &f in stack.kernel.iter().rev() {
            at = *self.children.get(&(at | KERNEL, f))?;
        }
        for &f in stack.user.iter().rev() {
            at = *self.children.get(&(at, f))?;
        }
        Some(at)
    }

    /// The stack of node `id`.
    pub(crate) fn stack(&self, id: u32) -> CallStack {
        let (mut kernel, mut user) = (Vec::new(), Vec::new());
        let mut at = self.nodes[id as usize];
        while at.parent != NONE {
            match at.parent & KERNEL {
                0 => user.push(at.frame),
                _ => kernel.push(at.frame),
            }
            at = self.nodes[(at.parent & !KERNEL) as usize];
        }
        CallStack {
            kernel: kernel.into(),
            user: user.into(),
            end: StackEnd::from_index(at.frame),
        }
    }

    /// Keeps only the nodes with a payload and their ancestors, ids renumbered in
    /// order (parents stay before children); payloads are kept.
    pub(crate) fn retain_with_payload(&mut self) {
        let mut live = vec![false; self.nodes.len()];
        for id in (0..self.nodes.len()).rev() {
            let n = self.nodes[id];
            if n.payload != NONE || live[id] {
                live[id] = true;
                if n.parent != NONE {
                    live[(n.parent & !KERNEL) as usize] = true;
                }
            }
        }
        let mut new_id = vec![NONE; self.nodes.len()];
        let old = std::mem::take(&mut self.nodes);
        self.children = FastMap::default();
        self.roots = [None; 4];
        for (id, mut n) in old.into_iter().enumerate() {
            if !live[id] {
                continue;
            }
            new_id[id] = self.nodes.len() as u32;
            if n.parent == NONE {
                self.roots[n.frame as usize] = Some(new_id[id]);
            } else {
                let flag = n.parent & KERNEL;
                n.parent = new_id[(n.parent & !KERNEL) as usize] | flag;
                self.children.insert((n.parent, n.frame), new_id[id]);
            }
            self.nodes.push(n);
        }
    }

    /// Whether each node is one of `ids` or an ancestor of one.
    pub(crate) fn on_paths_of(&self, ids: impl Iterator<Item = u32>) -> Vec<bool> {
        let mut on = vec![false; self.nodes.len()];
        for mut at in ids {
            while !on[at as usize] {
                on[at as usize] = true;
                match self.nodes[at as usize].parent {
                    NONE => break,
                    p => at = p & !KERNEL,
                }
            }
        }
        on
    }

    /// The nodes with a payload, and their payloads.
    pub(crate) fn payloads(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let ids = 0..self.nodes.len() as u32;
        ids.zip(&self.nodes)
            .filter(|(_, n)| n.payload != NONE)
            .map(|(id, n)| (id, n.payload))
    }

    /// For each node of `order` (the nodes of a holder's stacks, the last to go
    /// first), how many nodes go only when it goes: each node counts for the last
    /// stack that needs it.
    pub(crate) fn owned_by(&self, order: impl Iterator<Item = u32>) -> Vec<(u32, usize)> {
        let mut claimed = vec![false; self.nodes.len()];
        order
            .map(|id| {
                let mut n = 0;
                let mut at = id;
                while at != NONE && !claimed[at as usize] {
                    claimed[at as usize] = true;
                    n += 1;
                    let p = self.nodes[at as usize].parent;
                    at = if p == NONE { NONE } else { p & !KERNEL };
                }
                (id, n)
            })
            .collect()
    }
}
