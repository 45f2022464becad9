//! The property's counterexamples found so far, kept as explicit cases (run before the random
//! ones): a saved seed stops meaning the same case as soon as a generator changes.

use super::{Op, Setup};

/// `(before, during, tiny_event_buffer, additive)`, each as proptest shrank it.
#[rustfmt::skip]
pub fn cases() -> Vec<(Vec<Setup>, Vec<Op>, bool, bool)> {
    vec![
        // Seed a363d8d7a1bf.
        (
            vec![
                Setup::Op(Op::Write { dir: 3, name: 2, body: 10 }), Setup::Commit,
                Setup::Sparse { dir: 2, sparse_index: true },
            ],
            vec![
                Op::Append { dir: 7, name: 2 }, Op::Append { dir: 3, name: 7 },
                Op::Symlink { at: (5, 0), target: 2 }, Op::DropGit { dir: 1, name: 4 },
                Op::Rename { from: (6, 5), to: (4, 6) }, Op::Rename { from: (5, 2), to: (0, 4) },
                Op::Rename { from: (0, 1), to: (1, 2) }, Op::DropGit { dir: 4, name: 5 },
                Op::Symlink { at: (3, 2), target: 7 }, Op::RemoveDir { dir: 5 },
                Op::Remove { dir: 3, name: 3 }, Op::Rules { dir: 7, lines: vec![4, 9] },
                Op::Append { dir: 0, name: 7 }, Op::Rename { from: (0, 4), to: (4, 4) },
                Op::Write { dir: 4, name: 1, body: 157 }, Op::NestedRepo { dir: 2, name: 2 },
                Op::Write { dir: 3, name: 4, body: 105 }, Op::Append { dir: 4, name: 4 },
                Op::Write { dir: 2, name: 5, body: 97 }, Op::Append { dir: 5, name: 5 },
                Op::Mkdir { dir: 1, name: 2 }, Op::Rename { from: (3, 6), to: (7, 0) },
                Op::Rename { from: (3, 1), to: (7, 2) }, Op::Write { dir: 5, name: 2, body: 15 },
                Op::Remove { dir: 5, name: 7 }, Op::Rules { dir: 6, lines: vec![] },
                Op::Pause { millis: 308 }, Op::Write { dir: 5, name: 2, body: 194 },
                Op::WriteText { dir: 0, name: 0, text: 1 }, Op::Rules { dir: 0, lines: vec![8] },
                Op::Symlink { at: (5, 4), target: 0 }, Op::DropGit { dir: 0, name: 6 },
                Op::Write { dir: 2, name: 1, body: 44 }, Op::Append { dir: 2, name: 1 },
                Op::Rules { dir: 2, lines: vec![0, 4] },
            ],
            false,
            true,
        ),
        // Seed 950ab0861a17.
        (
            vec![
                Setup::Op(Op::Write { dir: 3, name: 4, body: 1 }), Setup::Commit,
            ],
            vec![
                Op::Executable { dir: 0, name: 0, on: false }, Op::Append { dir: 3, name: 3 },
                Op::Remove { dir: 1, name: 2 }, Op::Remove { dir: 7, name: 1 },
                Op::Mkdir { dir: 2, name: 1 }, Op::MoveDir { from: 3, to: (3, 2) },
                Op::WriteText { dir: 3, name: 7, text: 2 }, Op::Symlink { at: (4, 4), target: 4 },
                Op::Write { dir: 3, name: 4, body: 17 }, Op::Remove { dir: 4, name: 4 },
                Op::RemoveDir { dir: 7 }, Op::Append { dir: 2, name: 6 },
                Op::Rename { from: (0, 2), to: (3, 7) }, Op::Write { dir: 5, name: 3, body: 250 },
                Op::NestedRepo { dir: 4, name: 5 }, Op::WriteText { dir: 1, name: 7, text: 2 },
                Op::Mkdir { dir: 0, name: 1 }, Op::Pause { millis: 110 },
                Op::Executable { dir: 6, name: 0, on: true },
                Op::Rename { from: (3, 6), to: (7, 2) }, Op::Rename { from: (5, 3), to: (6, 3) },
                Op::Pause { millis: 7 }, Op::NestedRepo { dir: 6, name: 5 },
                Op::Rules { dir: 4, lines: vec![2, 13] }, Op::Rename { from: (0, 3), to: (0, 6) },
                Op::WriteText { dir: 4, name: 0, text: 4 }, Op::Burst { dir: 0, count: 4 },
                Op::Rename { from: (1, 7), to: (2, 0) }, Op::DropGit { dir: 1, name: 5 },
                Op::Write { dir: 2, name: 5, body: 232 }, Op::Rename { from: (7, 5), to: (3, 6) },
                Op::Append { dir: 5, name: 1 }, Op::Append { dir: 7, name: 1 },
                Op::Append { dir: 6, name: 2 },
            ],
            false,
            true,
        ),
        // Seed fd2e46dc7645.
        (
            vec![
                Setup::Submodule { dir: 0, name: 0, checked_out: true },
            ],
            vec![
                Op::Executable { dir: 0, name: 7, on: true },
                Op::Write { dir: 5, name: 3, body: 20 }, Op::Write { dir: 1, name: 5, body: 114 },
                Op::WriteText { dir: 1, name: 6, text: 1 }, Op::Remove { dir: 6, name: 3 },
                Op::Append { dir: 0, name: 4 }, Op::Pause { millis: 377 },
                Op::Remove { dir: 7, name: 0 }, Op::Mkdir { dir: 4, name: 6 },
                Op::MoveDir { from: 6, to: (1, 5) }, Op::WriteText { dir: 4, name: 5, text: 5 },
                Op::Rename { from: (1, 0), to: (6, 0) }, Op::Rules { dir: 0, lines: vec![9, 4] },
                Op::Rename { from: (3, 7), to: (2, 6) },
                Op::Executable { dir: 7, name: 6, on: false }, Op::Append { dir: 1, name: 0 },
                Op::Executable { dir: 5, name: 5, on: true }, Op::NestedRepo { dir: 7, name: 5 },
                Op::Rename { from: (5, 0), to: (7, 1) }, Op::Append { dir: 1, name: 3 },
                Op::Rules { dir: 2, lines: vec![0, 1] }, Op::Symlink { at: (3, 3), target: 2 },
                Op::Symlink { at: (3, 6), target: 5 }, Op::WriteText { dir: 1, name: 5, text: 2 },
                Op::Rules { dir: 1, lines: vec![9] }, Op::NestedRepo { dir: 2, name: 3 },
                Op::WriteText { dir: 2, name: 5, text: 3 }, Op::Mkdir { dir: 5, name: 0 },
                Op::Write { dir: 1, name: 1, body: 97 }, Op::Rename { from: (5, 0), to: (1, 0) },
            ],
            false,
            false,
        ),
        // Seed 7ec57d87b807.
        (
            vec![
                Setup::Op(Op::WriteText { dir: 7, name: 1, text: 0 }), Setup::Commit,
                Setup::Attributes { dir: 1, lines: vec![7] },
            ],
            vec![
                Op::Rules { dir: 0, lines: vec![2, 8] }, Op::RemoveDir { dir: 0 },
                Op::Burst { dir: 7, count: 31 },
            ],
            true,
            true,
        ),
        // Seed 1e50892de63e.
        (
            vec![
                Setup::Submodule { dir: 1, name: 4, checked_out: false },
                Setup::Op(Op::MoveDir { from: 7, to: (0, 3) }),
            ],
            vec![
                Op::Append { dir: 7, name: 0 }, Op::Write { dir: 7, name: 2, body: 166 },
                Op::NestedRepo { dir: 4, name: 0 }, Op::DropGit { dir: 7, name: 4 },
                Op::Append { dir: 1, name: 0 }, Op::Append { dir: 5, name: 7 },
                Op::WriteText { dir: 0, name: 2, text: 4 },
                Op::WriteText { dir: 3, name: 7, text: 0 },
                Op::Write { dir: 5, name: 7, body: 196 }, Op::Burst { dir: 0, count: 1 },
                Op::Append { dir: 2, name: 4 }, Op::Append { dir: 1, name: 5 },
                Op::Mkdir { dir: 2, name: 3 }, Op::Remove { dir: 7, name: 4 },
                Op::Rename { from: (6, 1), to: (0, 2) }, Op::Rename { from: (0, 2), to: (1, 7) },
                Op::WriteText { dir: 0, name: 5, text: 1 }, Op::Pause { millis: 16 },
                Op::Append { dir: 0, name: 2 }, Op::WriteText { dir: 1, name: 6, text: 1 },
                Op::Rename { from: (0, 7), to: (6, 1) }, Op::Pause { millis: 263 },
                Op::WriteText { dir: 3, name: 6, text: 4 }, Op::Remove { dir: 2, name: 1 },
                Op::Mkdir { dir: 0, name: 1 }, Op::Burst { dir: 4, count: 16 },
                Op::WriteText { dir: 3, name: 0, text: 2 }, Op::Mkdir { dir: 5, name: 1 },
                Op::Write { dir: 6, name: 1, body: 220 }, Op::Remove { dir: 7, name: 0 },
                Op::Write { dir: 0, name: 2, body: 226 }, Op::RemoveDir { dir: 4 },
                Op::Rename { from: (6, 6), to: (3, 1) }, Op::Remove { dir: 2, name: 3 },
                Op::Symlink { at: (6, 2), target: 5 }, Op::Append { dir: 4, name: 4 },
                Op::MoveDir { from: 0, to: (2, 6) }, Op::Write { dir: 5, name: 1, body: 251 },
            ],
            false,
            true,
        ),
        // Seed b532f85e1556.
        (
            vec![],
            vec![
                Op::Symlink { at: (5, 1), target: 0 }, Op::DropGit { dir: 5, name: 1 },
                Op::RemoveDir { dir: 3 }, Op::Write { dir: 1, name: 6, body: 236 },
                Op::Pause { millis: 249 }, Op::Rules { dir: 5, lines: vec![7] },
                Op::Rules { dir: 6, lines: vec![6, 0] }, Op::Rules { dir: 5, lines: vec![12, 2] },
                Op::Symlink { at: (4, 4), target: 0 }, Op::Burst { dir: 5, count: 53 },
                Op::WriteText { dir: 6, name: 1, text: 3 },
                Op::Executable { dir: 1, name: 5, on: true },
                Op::Executable { dir: 2, name: 0, on: false }, Op::DropGit { dir: 3, name: 2 },
                Op::Write { dir: 0, name: 1, body: 135 }, Op::NestedRepo { dir: 2, name: 6 },
                Op::Rules { dir: 6, lines: vec![10, 8] },
                Op::WriteText { dir: 6, name: 4, text: 4 }, Op::MoveDir { from: 0, to: (6, 4) },
                Op::Write { dir: 2, name: 1, body: 174 }, Op::Rules { dir: 3, lines: vec![] },
                Op::Write { dir: 2, name: 1, body: 100 }, Op::Write { dir: 5, name: 7, body: 75 },
                Op::RemoveDir { dir: 7 }, Op::WriteText { dir: 2, name: 0, text: 2 },
                Op::NestedRepo { dir: 6, name: 0 },
            ],
            false,
            false,
        ),
        // Seed 9bfe0f6b4ea7, found with the issue 25 widening (the user's index edits and
        // the rules corners): a sparse index with an intent-to-add entry, the one-event buffer.
        (
            vec![
                Setup::Op(Op::Write { dir: 0, name: 0, body: 2 }),
                Setup::Flag { dir: 2, name: 7, flag: 2 }, Setup::Sparse { dir: 2, sparse_index: true },
            ],
            vec![
                Op::Remove { dir: 4, name: 3 }, Op::Symlink { at: (5, 4), target: 0 },
                Op::Write { dir: 1, name: 1, body: 215 }, Op::Burst { dir: 4, count: 39 },
                Op::Rules { dir: 7, lines: vec![12] }, Op::Append { dir: 5, name: 5 },
                Op::Write { dir: 1, name: 7, body: 173 }, Op::Write { dir: 6, name: 2, body: 203 },
                Op::Remove { dir: 6, name: 6 }, Op::Rename { from: (5, 2), to: (5, 5) },
                Op::WriteText { dir: 2, name: 5, text: 7 }, Op::Remove { dir: 7, name: 4 },
                Op::Rules { dir: 6, lines: vec![14] }, Op::WriteText { dir: 4, name: 7, text: 2 },
                Op::Write { dir: 7, name: 6, body: 251 }, Op::Burst { dir: 2, count: 22 },
                Op::Append { dir: 4, name: 5 }, Op::Write { dir: 5, name: 7, body: 235 },
                Op::DropGit { dir: 4, name: 2 }, Op::Pause { millis: 329 },
                Op::Symlink { at: (6, 3), target: 4 }, Op::Write { dir: 0, name: 5, body: 168 },
                Op::Append { dir: 1, name: 3 }, Op::UserIndex { edit: 2, dir: 7, name: 5 },
                Op::UserIndex { edit: 1, dir: 0, name: 5 },
            ],
            true,
            true,
        ),
        // Every path ignored (rule 18 in info/exclude, core.ignoreCase): git's own commit
        // would refuse ("nothing to commit"), so HEAD stays unborn.
        (
            vec![Setup::IgnoreCase, Setup::Exclude { lines: vec![18], excludes_file: false }],
            vec![
                Op::Write { dir: 3, name: 6, body: 11 }, Op::Write { dir: 7, name: 5, body: 35 },
                Op::Rename { from: (4, 4), to: (5, 5) }, Op::Rules { dir: 1, lines: vec![] },
                Op::Symlink { at: (4, 5), target: 7 }, Op::Pause { millis: 292 },
                Op::Burst { dir: 4, count: 22 },
            ],
            false,
            true,
        ),
        // Seed bea080b1ab71, an intermittent race: paths under `b/x/build` committed though
        // ignored, after `Rules` in `a` and `MoveDir a → b/x`.
        (
            vec![],
            vec![
                Op::RemoveDir { dir: 3 }, Op::Append { dir: 2, name: 5 },
                Op::Executable { dir: 4, name: 1, on: true }, Op::WriteText { dir: 0, name: 7, text: 2 },
                Op::Executable { dir: 3, name: 1, on: false }, Op::Write { dir: 2, name: 5, body: 139 },
                Op::Append { dir: 2, name: 6 }, Op::MoveDir { from: 2, to: (5, 1) },
                Op::Rename { from: (6, 1), to: (6, 1) }, Op::WriteText { dir: 0, name: 7, text: 7 },
                Op::Rename { from: (2, 7), to: (0, 5) }, Op::Burst { dir: 0, count: 37 },
                Op::Rename { from: (7, 1), to: (4, 3) }, Op::Write { dir: 6, name: 0, body: 108 },
                Op::Rules { dir: 2, lines: vec![14, 2] }, Op::Burst { dir: 5, count: 56 },
                Op::Rules { dir: 0, lines: vec![] }, Op::Mkdir { dir: 0, name: 5 },
                Op::Rename { from: (4, 2), to: (4, 1) }, Op::Remove { dir: 2, name: 6 },
                Op::Write { dir: 5, name: 5, body: 109 }, Op::Write { dir: 2, name: 0, body: 235 },
                Op::Symlink { at: (3, 4), target: 1 }, Op::Write { dir: 3, name: 7, body: 53 },
                Op::NestedRepo { dir: 1, name: 2 }, Op::Append { dir: 1, name: 7 },
                Op::Rules { dir: 1, lines: vec![5, 15] }, Op::Write { dir: 7, name: 3, body: 67 },
                Op::WriteText { dir: 3, name: 4, text: 2 }, Op::MoveDir { from: 1, to: (3, 0) },
            ],
            false,
            false,
        ),
        // Seed 8b1e2dc24eeb, shrunk: a submodule left unchecked out outside a sparse checkout
        // (skip-worktree), then a repository made at its path: git keeps the gitlink, the
        // watcher moved it to the new repository's `HEAD`.
        (
            vec![
                Setup::Submodule { dir: 6, name: 1, checked_out: false },
                Setup::Sparse { dir: 1, sparse_index: false },
            ],
            vec![Op::NestedRepo { dir: 6, name: 1 }],
            false,
            true,
        ),
        // Seed d1d09b020ba8: a tracked file outside the sparse checkout, edited (so not
        // skip-worktree): `git add -A` leaves its entry as it is, the watcher saved the edit.
        (
            vec![
                Setup::RelativeExcludes { lines: vec![0] }, Setup::Commit,
                Setup::RelativeExcludes { lines: vec![6] },
                Setup::Sparse { dir: 7, sparse_index: false },
            ],
            vec![Op::Write { dir: 0, name: 3, body: 190 }],
            false,
            true,
        ),
    ]
}
