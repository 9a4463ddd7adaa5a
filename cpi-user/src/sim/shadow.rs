//! The exact call stack of every traced thread. The trace holds every taken transfer
//! and the decoded last instruction of each range ([`Flow`], cpi-user/src/sim/cycles.rs)
//! says which transfers are calls and returns, so the replay knows each thread's stack
//! of return addresses at every instruction — what a perfect unwinder would report.
//!
//! Stacks are nodes of a calling-context tree (one node per distinct chain of return
//! addresses): a call or a return is one step in the tree, and the exact truth is kept
//! per node (cpi-user/src/sim/replay.rs). Rules:
//! * a call pushes its return address, except a call to that very address (`call 1f;
//!   1: pop`, reading the PC), which makes no frame;
//! * a jump — a tail call included — leaves the stack as it is, as an unwinder sees it;
//! * a return to the top frame's address pops it; to an address deeper in the stack
//!   (a return after `longjmp`) pops down to it; to an address not on the stack (a
//!   retpoline, a signal restorer) pops one frame, the one the `ret` consumed;
//! * a transfer out of code whose bytes could not be read (JIT code: its last
//!   instruction undecoded) to the top frame's return address is that call's return;
//! * a signal delivery pushes the resume address as the handler's caller;
//! * the tree holds at most [`MAX_CONTEXTS`] nodes; calls beyond it are counted as
//!   hidden frames of the thread, and samples taken under hidden frames carry only their
//!   IP, marked [`StackEnd::Error`] (nothing invented).

use cpi_common::wire::MAX_USER_FRAMES;

use super::cycles::Flow;
use super::FastMap;
use crate::profile::{CallStack, StackEnd};

/// Most distinct calling contexts kept (≈ 40 bytes each).
pub(crate) const MAX_CONTEXTS: usize = 1 << 21;
/// How far up a return looks for its address before it counts as unmatched.
const MAX_SEARCH: u32 = 4096;

/// One node of the calling-context tree.
#[derive(Clone, Copy, Debug)]
struct Node {
    parent: u32,
    ret: u64,
    depth: u32,
}

/// Where one thread stands: its node and the calls made beyond a full tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ThreadStack {
    /// Its calling context ([`ContextTree::ROOT`]: no frame above the code running).
    pub node: u32,
    /// Calls not represented because the tree was full.
    pub hidden: u32,
}

/// The calling-context tree of one traced process.
pub(crate) struct ContextTree {
    nodes: Vec<Node>,
    children: FastMap<(u32, u64), u32>,
    /// Calls that found the tree full.
    pub overflows: u64,
}

impl Default for ContextTree {
    fn default() -> Self {
        ContextTree {
            nodes: vec![Node {
                parent: Self::ROOT,
                ret: 0,
                depth: 0,
            }],
            children: FastMap::default(),
            overflows: 0,
        }
    }
}

impl ContextTree {
    /// The empty stack.
    pub const ROOT: u32 = 0;

    /// The stack after the range ending in `last` transferred to `to` under `at`.
    pub(crate) fn transfer(&mut self, at: ThreadStack, last: Flow, to: u64) -> ThreadStack {
        match last {
            Flow::Direct { ret_to: Some(ret) } | Flow::Indirect { ret_to: Some(ret) }
                if ret != to =>
            {
                self.push(at, ret)
            }
            Flow::Return => self.ret(at, to),
            Flow::Other
                if at.hidden == 0 && at.node != Self::ROOT && self.ret_addr(at.node) == to =>
            {
                self.ret(at, to)
            }
            _ => at,
        }
    }

    /// A signal handler starts under `at`; it will resume at `resume`.
    pub fn signal(&mut self, at: ThreadStack, resume: u64) -> ThreadStack {
        self.push(at, resume)
    }

    fn push(&mut self, at: ThreadStack, ret: u64) -> ThreadStack {
        if at.hidden > 0 {
            self.overflows += 1;
            return ThreadStack {
                hidden: at.hidden.saturating_add(1),
                ..at
            };
        }
        if let Some(&node) = self.children.get(&(at.node, ret)) {
            return ThreadStack { node, hidden: 0 };
        }
        if self.nodes.len() >= MAX_CONTEXTS {
            self.overflows += 1;
            return ThreadStack { hidden: 1, ..at };
        }
        let node = self.nodes.len() as u32;
        self.nodes.push(Node {
            parent: at.node,
            ret,
            depth: self.nodes[at.node as usize].depth + 1,
        });
        self.children.insert((at.node, ret), node);
        ThreadStack { node, hidden: 0 }
    }

    fn ret(&self, at: ThreadStack, to: u64) -> ThreadStack {
        if at.hidden > 0 {
            return ThreadStack {
                hidden: at.hidden - 1,
                ..at
            };
        }
        let mut n = at.node;
        for _ in 0..MAX_SEARCH {
            if n == Self::ROOT {
                break;
            }
            let node = self.nodes[n as usize];
            if node.ret == to {
                return ThreadStack {
                    node: node.parent,
                    hidden: 0,
                };
            }
            n = node.parent;
        }
        ThreadStack {
            node: self.parent(at.node),
            hidden: 0,
        }
    }

    /// The caller's context of `node` (the root is its own parent).
    pub fn parent(&self, node: u32) -> u32 {
        self.nodes[node as usize].parent
    }

    /// Return address of the frame `node` adds (0 for the root).
    pub(crate) fn ret_addr(&self, node: u32) -> u64 {
        self.nodes[node as usize].ret
    }

    /// Frames above the code running in `node`.
    pub fn depth(&self, node: u32) -> u32 {
        self.nodes[node as usize].depth
    }

    /// Nodes in the tree (the root included); node ids are `0..len()`.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The stack an unwinder would report at `ip` under `at`: `[ip, return addresses…]`
    /// leaf first, cut at [`MAX_USER_FRAMES`] (then [`StackEnd::Truncated`]).
    pub(crate) fn call_stack(&self, at: ThreadStack, ip: u64) -> CallStack {
        if at.hidden > 0 {
            return CallStack {
                user: Box::new([ip]),
                end: StackEnd::Error,
                ..CallStack::default()
            };
        }
        let depth = self.depth(at.node) as usize;
        let mut user = Vec::with_capacity((depth + 1).min(MAX_USER_FRAMES));
        user.push(ip);
        let mut n = at.node;
        while n != Self::ROOT && user.len() < MAX_USER_FRAMES {
            user.push(self.ret_addr(n));
            n = self.parent(n);
        }
        CallStack {
            user: user.into_boxed_slice(),
            end: if depth + 1 > MAX_USER_FRAMES {
                StackEnd::Truncated
            } else {
                StackEnd::Complete
            },
            ..CallStack::default()
        }
    }
}

/// A range's stacks for the PMU model: `before` while its instructions run, `after`
/// once its taken transfer retired.
pub struct Frames<'a> {
    /// The tree the nodes belong to.
    pub tree: &'a ContextTree,
    /// The stack of the range's instructions.
    pub before: ThreadStack,
    /// The stack after the range's last transfer.
    pub after: ThreadStack,
}

impl Frames<'_> {
    /// The stack of a sample at `ip` inside the range.
    pub fn before(&self, ip: u64) -> CallStack {
        self.tree.call_stack(self.before, ip)
    }

    /// The stack of a sample at `ip` after the range's transfer.
    pub fn after(&self, ip: u64) -> CallStack {
        self.tree.call_stack(self.after, ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: Flow = Flow::Direct {
        ret_to: Some(0x105),
    };

    fn call(ret: u64) -> Flow {
        Flow::Direct { ret_to: Some(ret) }
    }

    fn user(t: &ContextTree, at: ThreadStack) -> (Vec<u64>, StackEnd) {
        let s = t.call_stack(at, 0x1);
        (s.user.to_vec(), s.end)
    }

    #[test]
    fn calls_push_returns_pop_and_jumps_keep_the_stack() {
        let mut t = ContextTree::default();
        let root = ThreadStack::default();
        let a = t.transfer(root, CALL, 0x200);
        let b = t.transfer(
            a,
            Flow::Indirect {
                ret_to: Some(0x210),
            },
            0x300,
        );
        assert_eq!(user(&t, b), (vec![0x1, 0x210, 0x105], StackEnd::Complete));
        // A tail call (jump into another function) keeps the caller's return address.
        let c = t.transfer(b, Flow::Direct { ret_to: None }, 0x400);
        assert_eq!(c, b);
        let c = t.transfer(c, Flow::Indirect { ret_to: None }, 0x500);
        assert_eq!(c, b);
        // Returns pop; the same call again finds the same node.
        let back = t.transfer(c, Flow::Return, 0x210);
        assert_eq!(back, a);
        assert_eq!(t.transfer(a, Flow::Return, 0x105), root);
        assert_eq!(t.transfer(root, CALL, 0x200), a);
        assert_eq!(t.len(), 3);
        // Reading the PC with `call next` makes no frame.
        assert_eq!(t.transfer(a, call(0x250), 0x250), a);
        assert_eq!(t.transfer(a, Flow::Conditional, 0x200), a);
    }

    #[test]
    fn unmatched_returns_pop_to_the_target_or_one_frame() {
        let mut t = ContextTree::default();
        let mut at = ThreadStack::default();
        for ret in [0x10, 0x20, 0x30, 0x40] {
            at = t.transfer(at, call(ret), 0x1000);
        }
        // A return to a frame deeper in the stack (after longjmp) pops down to it.
        let deep = t.transfer(at, Flow::Return, 0x20);
        assert_eq!(user(&t, deep).0, vec![0x1, 0x10]);
        // A return to no frame on the stack (retpoline, signal restorer) pops one.
        let one = t.transfer(at, Flow::Return, 0x999);
        assert_eq!(user(&t, one).0, vec![0x1, 0x30, 0x20, 0x10]);
        // At the bottom it stays there.
        let root = ThreadStack::default();
        assert_eq!(t.transfer(root, Flow::Return, 0x999), root);
        // A signal handler's return (to the restorer) pops the frame the delivery
        // pushed.
        let h = t.signal(at, 0x77);
        assert_eq!(user(&t, h).0, vec![0x1, 0x77, 0x40, 0x30, 0x20, 0x10]);
        assert_eq!(t.transfer(h, Flow::Return, 0xdead), at);
        // Undecoded code (JIT) that lands on the top frame's return address returned;
        // elsewhere it jumped.
        assert_eq!(
            t.transfer(at, Flow::Other, 0x40),
            t.transfer(at, Flow::Return, 0x40)
        );
        assert_eq!(t.transfer(at, Flow::Other, 0x30), at);
    }

    #[test]
    fn deep_recursion_is_truncated_and_unwinds_back() {
        let mut t = ContextTree::default();
        let root = ThreadStack::default();
        let mut at = root;
        for _ in 0..10_000 {
            at = t.transfer(at, CALL, 0x100);
        }
        assert_eq!(t.depth(at.node), 10_000);
        let (frames, end) = user(&t, at);
        assert_eq!(frames.len(), MAX_USER_FRAMES);
        assert!(frames[1..].iter().all(|&r| r == 0x105));
        assert_eq!(end, StackEnd::Truncated);
        // At the limit exactly: complete.
        let mut shallow = root;
        for _ in 0..MAX_USER_FRAMES - 1 {
            shallow = t.transfer(shallow, CALL, 0x100);
        }
        assert_eq!(user(&t, shallow).1, StackEnd::Complete);
        for _ in 0..10_000 {
            at = t.transfer(at, Flow::Return, 0x105);
        }
        assert_eq!(at, root);
    }

    #[test]
    fn a_full_tree_hides_frames_and_says_so() {
        let mut t = ContextTree::default();
        let mut at = ThreadStack::default();
        let mut ret = 0u64;
        while t.len() < MAX_CONTEXTS {
            ret += 1;
            at = t.transfer(at, call(ret), 0x1000);
        }
        let full = at;
        let one = t.transfer(full, call(0xabc), 0x1);
        let hidden = t.transfer(one, call(0xdef), 0x1);
        assert_eq!(hidden.hidden, 2);
        assert_eq!(t.overflows, 2);
        assert_eq!(user(&t, hidden), (vec![0x1], StackEnd::Error));
        let one = t.transfer(hidden, Flow::Return, 0xdef);
        let back = t.transfer(one, Flow::Return, 0xabc);
        assert_eq!(back, full);
    }
}
