//! A workflow's source as findings point into it: the position of a node, of a map's
//! key, of text below a node; and how the files a workflow names are read
//! ([`Resolver`]).

use crate::yaml::{Mark, Node};

/// Positions in one workflow's source.
pub(crate) struct Source<'a> {
    root: &'a Node,
    text: &'a str,
}

impl<'a> Source<'a> {
    pub fn new(root: &'a Node, text: &'a str) -> Source<'a> {
        Source { root, text }
    }

    /// The position of the node at `path` (or the closest one above it).
    pub fn at<S: AsRef<str>>(&self, path: &[S]) -> Mark {
        self.root.locate(path).mark
    }

    /// The position of a map key (a job's id), else of its value.
    pub fn key_at(&self, parent: &[&str], key: &str) -> Mark {
        let parent_node = self.root.locate(parent);
        parent_node
            .key(key)
            .map(|k| k.mark)
            .unwrap_or(parent_node.mark)
    }

    /// Where `needle` first appears at or after the node at `path` (a `${{ }}` inside a
    /// block script is lines below the `run:` key).
    pub fn text_at<S: AsRef<str>>(&self, path: &[S], needle: &str) -> Mark {
        let start = self.at(path);
        for (i, line) in self
            .text
            .lines()
            .enumerate()
            .skip(start.line.saturating_sub(1))
        {
            if let Some(col) = line.find(needle) {
                return Mark {
                    line: i + 1,
                    col: line[..col].chars().count() + 1,
                };
            }
        }
        start
    }
}

/// Reads a file that a `uses:` names, by its path from the repository's root: a workflow
/// a job calls (`./.github/workflows/gpu.yml`), a local action's
/// (`./.github/actions/setup/action.yml`). Its file name for findings and its text, or
/// `None` when it is not at hand.
pub type Resolver<'r> = &'r dyn Fn(&str) -> Option<(String, String)>;
