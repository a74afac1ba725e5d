//! Messages from the tasks of a job to the `srun` that started it, on the tasks'
//! standard output. `srun --label` keeps the tasks' lines apart (each starts with
//! `RANK: `) but cuts a line at 1024 bytes; unlabelled, the tasks' output interleaves
//! mid-line. So each message is base64 in lines well under that size: `CW+` before
//! every piece but the last, `CW=` before the last.

use base64::Engine as _;

/// The base64 characters a line carries (the line stays under Slurm's 1024 bytes).
const PIECE: usize = 960;
/// The largest message one task may send (a batch's record with its cases).
const MAX_MESSAGE: usize = 64 << 20;

const MORE: &str = "CW+";
const LAST: &str = "CW=";

/// A message as the lines a task prints.
pub fn encode(message: &[u8]) -> String {
    let text = base64::engine::general_purpose::STANDARD.encode(message);
    let pieces: Vec<&str> = if text.is_empty() {
        vec![""]
    } else {
        text.as_bytes()
            .chunks(PIECE)
            .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
            .collect()
    };
    let mut out = String::with_capacity(text.len() + pieces.len() * 5);
    for (i, piece) in pieces.iter().enumerate() {
        out.push_str(if i + 1 == pieces.len() { LAST } else { MORE });
        out.push_str(piece);
        out.push('\n');
    }
    out
}

/// What one line of `srun --label`'s output was.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// Part of a message, not yet whole.
    Partial,
    /// A whole message from the task of this rank.
    Message { rank: u32, bytes: Vec<u8> },
    /// A line that is no message (something on the node printed to cibox's output).
    Stray { rank: Option<u32>, text: String },
}

/// Reassembles the messages of each task from `srun --label`'s lines.
#[derive(Default)]
pub struct Decoder {
    partial: std::collections::HashMap<u32, String>,
}

impl Decoder {
    /// Takes one line (without its newline).
    pub fn line(&mut self, line: &str) -> Line {
        let Some((rank, rest)) = split_label(line) else {
            return Line::Stray {
                rank: None,
                text: line.to_string(),
            };
        };
        let (last, piece) = if let Some(p) = rest.strip_prefix(MORE) {
            (false, p)
        } else if let Some(p) = rest.strip_prefix(LAST) {
            (true, p)
        } else {
            return Line::Stray {
                rank: Some(rank),
                text: rest.to_string(),
            };
        };
        let buf = self.partial.entry(rank).or_default();
        if buf.len() + piece.len() > MAX_MESSAGE * 4 / 3 + 4 {
            buf.clear();
            return Line::Stray {
                rank: Some(rank),
                text: format!("(a message over {} MiB, dropped)", MAX_MESSAGE >> 20),
            };
        }
        buf.push_str(piece);
        if !last {
            return Line::Partial;
        }
        let text = std::mem::take(buf);
        match base64::engine::general_purpose::STANDARD.decode(text.as_bytes()) {
            Ok(bytes) => Line::Message { rank, bytes },
            Err(e) => Line::Stray {
                rank: Some(rank),
                text: format!("(a message that is not base64: {e})"),
            },
        }
    }
}

/// `RANK: rest` as `srun --label` writes it (the rank padded with spaces when the
/// job has 10 tasks or more).
fn split_label(line: &str) -> Option<(u32, &str)> {
    let trimmed = line.trim_start();
    let (rank, rest) = trimmed.split_once(": ")?;
    Some((rank.parse().ok()?, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_survive_labels_and_interleaving() {
        let big: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let a = encode(&big);
        let b = encode(b"{\"ev\":\"started\"}");
        assert!(a.lines().all(|l| l.len() < 1000));
        let mut d = Decoder::default();
        let mut got = Vec::new();
        // Rank 1's lines between rank 0's, as two tasks print at once.
        let mut a_lines = a.lines();
        let first = a_lines.next().unwrap();
        for line in std::iter::once(format!("0: {first}"))
            .chain(b.lines().map(|l| format!(" 1: {l}")))
            .chain(a_lines.map(|l| format!("0: {l}")))
            .chain(std::iter::once("0: hello".to_string()))
        {
            match d.line(&line) {
                Line::Partial => {}
                other => got.push(other),
            }
        }
        assert_eq!(
            got,
            [
                Line::Message {
                    rank: 1,
                    bytes: b"{\"ev\":\"started\"}".to_vec()
                },
                Line::Message {
                    rank: 0,
                    bytes: big
                },
                Line::Stray {
                    rank: Some(0),
                    text: "hello".into()
                }
            ]
        );
        assert_eq!(
            d.line("srun: error: x"),
            Line::Stray {
                rank: None,
                text: "srun: error: x".into()
            }
        );
        assert_eq!(
            d.line(&format!("0: {}", encode(b"").trim_end())),
            Line::Message {
                rank: 0,
                bytes: vec![]
            }
        );
    }
}
