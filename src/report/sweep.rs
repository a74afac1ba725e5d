//! What a sweep of dead runs' containers did, and what to tell a user about it.

/// What a sweep did. It prints nothing: its caller says what it found ([`Swept::notes`]).
#[derive(Debug, Default)]
pub struct Swept {
    /// Containers of dead runs, removed: name and ID.
    pub removed: Vec<(String, String)>,
    /// Containers of runs still alive on this host (another job sharing the scope):
    /// name and run.
    pub live: Vec<(String, String)>,
    /// Containers made from another host, which only that host can judge: name and
    /// host.
    pub elsewhere: Vec<(String, String)>,
    /// Volumes of dead runs (their snapshots of the source), removed: name.
    pub volumes_removed: Vec<String>,
    /// Runs whose upper layers of `/work` (tmpfs mounts on this host) were removed.
    pub layers_removed: Vec<String>,
}

/// How much a note about a sweep matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Note {
    Debug,
    Info,
    Warn,
}

impl Swept {
    /// What to tell a user about each container the sweep looked at.
    pub fn notes(&self) -> Vec<(Note, String)> {
        let mut notes: Vec<(Note, String)> = Vec::new();
        for (name, run) in &self.live {
            notes.push((
                Note::Debug,
                format!("leaving {name}: its run {run} is alive"),
            ));
        }
        for (name, id) in &self.removed {
            notes.push((
                Note::Info,
                format!(
                    "removing leftover container {name} ({})",
                    &id[..12.min(id.len())]
                ),
            ));
        }
        for name in &self.volumes_removed {
            notes.push((Note::Info, format!("removing leftover volume {name}")));
        }
        for run in &self.layers_removed {
            notes.push((
                Note::Info,
                format!("removing leftover upper layers of /work of run {run}"),
            ));
        }
        for (name, other) in &self.elsewhere {
            notes.push((
                Note::Warn,
                format!("leaving {name}: made on host {other}; run `cibox cleanup` there"),
            ));
        }
        notes
    }
}
