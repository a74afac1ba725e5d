//! The command line (docs/interface.md §3). Parsing only; [`crate::cmd`] does the work.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// `VERSION (commit C)`, as `cibox --version` prints it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CIBOX_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "cibox",
    version = VERSION,
    about = "Reproducible, safe GPU CI: verified images, leased GPUs, disposable containers",
    after_help = "Exit codes: 0 ok, 1 tests failed, 2 usage/configuration, 3 image refused, \
                  4 no GPU capacity, 5 infrastructure, 124 timeout, 128+N signal N."
)]
pub struct Cli {
    /// The manifest (default: cibox.yaml from the current folder upwards to the git root).
    #[arg(long, global = true, env = "CIBOX_MANIFEST", value_name = "PATH")]
    pub manifest: Option<PathBuf>,
    /// Print data as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// More detail on stderr (repeatable); see also CIBOX_LOG.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Images: lockset, verify, load, build, save, qualify.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Check the engine, GPU runtime, GPU probe (NVML or nvidia-smi), lock dir and pool.
    Doctor,
    /// Start a project: a commented cibox.yaml from the test and lock files found, an
    /// image recipe stub and workflow templates (CPU, GPU, warm-up); never overwrites.
    Init,
    /// GPUs: status, leased execution, and fake GPUs for a machine without any.
    #[command(subcommand)]
    Gpu(GpuCommand),
    /// Batches: list and run.
    #[command(subcommand)]
    Batch(BatchCommand),
    /// Layers: run every batch of a layer.
    #[command(subcommand)]
    Layer(LayerCommand),
    /// Remove the containers of dead runs on this host, of one scope or of all (exact
    /// cibox labels and name; never prunes).
    Cleanup(CleanupArgs),
    /// Which layers could be admitted now (never waits).
    Capacity(CapacityArgs),
    /// Changed test files and their GPU counts, as a JSON matrix.
    Changed(ChangedArgs),
    /// CI workflows: render from templates, lint.
    #[command(subcommand)]
    Workflow(WorkflowCommand),
    /// Replay a recorded batch locally from its result.json.
    Reproduce(ReproduceArgs),
    /// The host's caches of this project: list, inspect, prune.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// Artifacts between layers: check one before a later layer uses it, print its digest.
    #[command(subcommand)]
    Artifact(ArtifactCommand),
    /// This host: its policy, and the one-time setup of its lock dir (as root).
    #[command(subcommand)]
    Host(HostCommand),
    /// Shell completion for bash, zsh, fish, elvish or PowerShell, on stdout
    /// (`cibox completions bash > /etc/bash_completion.d/cibox`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// The manual page, in roff, on stdout (`cibox man | man -l -`); with `--dir`, every
    /// page the manual names (`cibox.1`, `cibox-batch.1`, `cibox-batch-run.1`, …) in DIR.
    Man {
        /// Write the pages into this folder (`/usr/local/share/man/man1`).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// (Internal) the supervisor of a `gpu exec` command: confines it, and kills all of
    /// it if cibox dies.
    #[command(name = "__confine", hide = true)]
    Confine(ConfineArgs),
    /// (Internal) the watchdog of a batch container: removes it if cibox dies.
    #[command(name = "__watchdog", hide = true)]
    Watchdog {
        /// The container's ID.
        container: String,
    },
    /// (Internal) on a node of a Slurm job: runs the batch the submitter sent.
    #[command(name = "__slurm-node", hide = true)]
    SlurmNode {
        /// The node's job, as JSON.
        job: String,
    },
    /// (Internal) in a helper container with the engine's host's `/`: how host paths
    /// stand there (ownership, links), for a cibox in a container.
    #[command(name = "__host-folders", hide = true)]
    HostFolders {
        /// The invoking user's uid.
        #[arg(long)]
        me: u32,
        /// Paths on the engine's host.
        #[arg(last = true)]
        paths: Vec<std::path::PathBuf>,
    },
    /// (Internal) renders one workflow template, for `workflow render` (which runs it
    /// with bounded memory and time).
    #[command(name = "__render-template", hide = true)]
    RenderTemplate {
        /// `github` or `buildkite`.
        #[arg(long)]
        flavor: String,
        /// The template.
        template: std::path::PathBuf,
        /// The diff's base a selection was made from (`workflow render --base`).
        #[arg(long, requires = "selection_head")]
        selection_base: Option<String>,
        /// The diff's head.
        #[arg(long, requires = "selection_base")]
        selection_head: Option<String>,
        /// A change group the diff changed (repeated).
        #[arg(long = "changed", requires = "selection_base")]
        changed: Vec<String>,
        /// The test lists the parent collected (`collect:`), as JSON on standard input.
        #[arg(long)]
        collected_stdin: bool,
    },
    /// (Internal) the watchdog of a batch's Slurm job: cancels it if cibox dies.
    #[command(name = "__slurm-watchdog", hide = true)]
    SlurmWatchdog {
        /// The job's name.
        name: String,
        /// The `srun` that submits it.
        srun: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Print the lockset text of the manifest's lock files and its digest.
    Lockset {
        /// Which of the manifest's `images` (default: `default`).
        #[arg(long)]
        name: Option<String>,
    },
    /// Check that an image is present locally and was built from the source's lockset.
    Verify {
        /// Full `sha256:` image ID (default: CIBOX_IMAGE, then image.id).
        id: Option<String>,
        /// Which of the manifest's `images` (default: `default`).
        #[arg(long)]
        name: Option<String>,
    },
    /// Stream a docker-archive into the engine, print its ID, verify it.
    Load {
        /// The archive (`-` for standard input).
        #[arg(long, value_name = "FILE", default_value = "-")]
        from: String,
        /// Do not verify the loaded image against the source's lockset.
        #[arg(long)]
        no_verify: bool,
        /// Which of the manifest's `images` it is (default: `default`).
        #[arg(long)]
        name: Option<String>,
    },
    /// Pull an image pinned by digest from its registry, print its ID, verify it.
    Fetch {
        /// `REPOSITORY@sha256:…` (default: image.ref). Never a tag.
        reference: Option<String>,
        /// Which of the manifest's `images` it is (default: `default`).
        #[arg(long)]
        name: Option<String>,
    },
    /// Build the manifest's recipe (Dockerfile or Nix), label it with the lockset, print its ID.
    Build {
        /// Which of the manifest's `images` (default: `default`).
        #[arg(long)]
        name: Option<String>,
        /// Build twice without the cache and fail (exit 3, naming the files that
        /// differ) unless both give the same ID.
        #[arg(long)]
        check: bool,
        /// A secret a `RUN --mount=type=secret,id=ID` step reads: from a variable
        /// (`id=ID,env=VARIABLE`; `id=ID` alone reads `ID`) or a file (`id=ID,src=FILE`).
        /// Never in the image, the log or the manifest. Repeatable.
        #[arg(long = "secret", value_name = "id=ID,env=VAR|src=FILE")]
        secrets: Vec<String>,
    },
    /// Push a verified image to a registry and print `REPOSITORY@sha256:…` (for image.ref).
    Push {
        /// Full `sha256:` image ID.
        id: String,
        /// The repository to push to (`[registry[:port]/]path`, no tag); credentials
        /// come from the docker client's configuration.
        #[arg(long, value_name = "REPOSITORY")]
        to: String,
        /// Which of the manifest's `images` it is (default: `default`).
        #[arg(long)]
        name: Option<String>,
    },
    /// Print the image ID of a docker-archive, read from the archive alone (no engine).
    Id {
        /// The archive (`-` for standard input).
        #[arg(long, value_name = "FILE", default_value = "-")]
        from: String,
        /// Which of the manifest's `images` it is, to compare with its pinned `id`
        /// (default: `default`, when there is a manifest).
        #[arg(long)]
        name: Option<String>,
    },
    /// Verify, run the qualification layer on the image, write a qualification record.
    Qualify {
        /// Full `sha256:` image ID.
        id: String,
        /// Where the reports and `qualification.json` go.
        #[arg(long, default_value = "cibox-qualify")]
        reports: PathBuf,
        /// Source tree to test (default: the git toplevel).
        #[arg(long)]
        source: Option<PathBuf>,
        /// Cleanup scope (default on GitHub Actions gh-RUNID-ATTEMPT, else local-USER).
        #[arg(long, env = "CIBOX_SCOPE")]
        scope: Option<String>,
    },
    /// Write `docker save` of an image: a backup that `image load` restores to the same ID.
    Save {
        /// Full `sha256:` image ID.
        id: String,
        /// Where to write the archive.
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// One row per cache: size, files, current generation, last use, runs writing.
    List {
        /// Every project's caches, not only this manifest's.
        #[arg(long)]
        all_projects: bool,
    },
    /// One cache: its generations (which are read now), layers being written, size,
    /// and its pull requests' scopes.
    Inspect {
        /// The cache's name (a key of the manifest's `caches:`).
        name: String,
        /// Say how warm a run of this pull request will be: the base's generation and
        /// what the pull request's own scope adds over it.
        #[arg(long, value_name = "N")]
        pull_request: Option<u64>,
    },
    /// Remove what no batch uses: old generations, layers of dead runs, pull requests'
    /// scopes unused for the policy's `pull_request_expiry`.
    Prune {
        /// The caches to prune (default: every cache of this project).
        names: Vec<String>,
        /// Start the caches again empty, and remove every pull request's scope no run
        /// uses now (generations in use stay until their batches end).
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ArtifactCommand {
    /// Check batches' artifacts in the reports folder (after a CI download): made by
    /// this CI run at this trust, every file a regular file of the digest its listing
    /// says; `BATCH=sha256:…` also checks the listing against the digest the
    /// producer's job handed over. Exit 2 when one is refused.
    Verify {
        /// `BATCH` or `BATCH=sha256:<64 hex>`.
        #[arg(required = true, value_parser = parse_artifact_arg)]
        artifacts: Vec<(String, Option<String>)>,
        /// The reports folder that holds `_artifacts/` (default `cibox-reports`).
        #[arg(long, value_name = "DIR")]
        reports: Option<PathBuf>,
    },
    /// Print the digest of a batch's artifact listing, for the next CI job to check.
    Digest {
        /// The producer batch.
        batch: String,
        /// The reports folder that holds `_artifacts/` (default `cibox-reports`).
        #[arg(long, value_name = "DIR")]
        reports: Option<PathBuf>,
    },
}

/// `BATCH` or `BATCH=sha256:<64 hex>`, checked as the command line is read.
fn parse_artifact_arg(arg: &str) -> Result<(String, Option<String>), String> {
    let (batch, digest) = match arg.split_once('=') {
        Some((b, d)) => (b, Some(d)),
        None => (arg, None),
    };
    let name_ok = batch
        .bytes()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && batch
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    if !name_ok {
        return Err(format!("`{}` is not a batch name", batch.escape_debug()));
    }
    if let Some(d) = digest {
        let hex = d.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!(
                "`{}` is not a digest: write sha256: and 64 lowercase hex digits",
                d.escape_debug()
            ));
        }
    }
    Ok((batch.to_string(), digest.map(str::to_string)))
}

#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// Create the GPU lock dir and every file a lease depends on, owned by root, so no
    /// other user of the host can remove or plant them (run once, as root).
    Setup {
        /// The lock dir (default: the host policy's gpu.lock_dir, else /run/lock/cibox).
        #[arg(long, value_name = "DIR")]
        lock_dir: Option<PathBuf>,
    },
    /// The host policy in force and what it grants.
    Policy,
}

#[derive(Debug, Subcommand)]
pub enum GpuCommand {
    /// One row per GPU: memory, utilisation, processes, pool, lease holder, idle verdict.
    Status,
    /// Lease GPUs and run a command with CUDA_VISIBLE_DEVICES set.
    Exec(GpuExecArgs),
    /// Fake GPUs of a vendor and model on a machine without them, to see a multi-GPU
    /// batch lease and run (never real hardware: doctor, records and reports say so).
    /// Prints the variables to export: `eval "$(cibox gpu fake --count 2)"`.
    Fake(GpuFakeArgs),
}

#[derive(Debug, Args)]
pub struct GpuFakeArgs {
    /// The vendor whose tool is faked: nvidia (nvidia-smi) or amd (rocm-smi).
    #[arg(long, default_value = "nvidia")]
    pub vendor: String,
    /// The model the GPUs report (default: NVIDIA H100 80GB HBM3, AMD Instinct MI300X).
    #[arg(long)]
    pub model: Option<String>,
    /// How many GPUs (1 to 64).
    #[arg(long, default_value_t = 2)]
    pub count: u32,
    /// The folder to write (default: $XDG_STATE_HOME/cibox/fake-gpus, else
    /// ~/.local/state/cibox/fake-gpus).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct GpuExecArgs {
    /// How many GPUs to lease.
    #[arg(long, conflicts_with = "devices")]
    pub count: Option<u32>,
    /// Which GPUs to lease (indices or UUIDs, comma-separated).
    #[arg(long, value_name = "LIST")]
    pub devices: Option<String>,
    /// Only GPUs of this model: a glob matched, case ignored, against the whole model
    /// name the probe reports (`*H100*`).
    #[arg(long, value_name = "GLOB", conflicts_with = "devices")]
    pub model: Option<String>,
    /// How long to wait for the GPUs (default: the manifest's gpu.wait; `0s`: try once).
    #[arg(long, value_name = "DUR")]
    pub wait: Option<crate::units::Span>,
    /// The variable to set (default CUDA_VISIBLE_DEVICES).
    #[arg(long, value_name = "NAME")]
    pub env_name: Option<String>,
    /// Pass indices instead of UUIDs.
    #[arg(long)]
    pub index: bool,
    /// The command to run.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ConfineArgs {
    #[arg(long)]
    pub owner: i32,
    #[arg(long)]
    pub report_fd: i32,
    #[arg(long)]
    pub grace_ms: u64,
    #[arg(long)]
    pub interactive: bool,
    #[arg(long)]
    pub subreaper: bool,
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum BatchCommand {
    /// The manifest's batches and layers.
    List(BatchListArgs),
    /// Run batches, each in its own disposable container.
    Run(BatchRunArgs),
}

#[derive(Debug, Args)]
pub struct BatchListArgs {
    /// Only these batches (a test list's name: all its entries), without the layers.
    pub names: Vec<String>,
    /// Only the batches of this layer, without the layers.
    #[arg(long)]
    pub layer: Option<String>,
    /// Show part K of N of the batches (or of the layer), as `--partition K/N` splits
    /// them, with each part's expected time.
    #[arg(long, value_name = "K/N")]
    pub partition: Option<String>,
    /// An earlier run's timings.json (or a folder of them), as `batch run` takes it.
    /// Repeatable.
    #[arg(long, value_name = "PATH")]
    pub timings: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BatchRunArgs {
    /// Batches to run.
    pub names: Vec<String>,
    /// Run the named batches as part of this layer (its fast mode applies; each must
    /// belong to it); with no names, run all of its batches.
    #[arg(long)]
    pub layer: Option<String>,
    #[command(flatten)]
    pub options: RunOptions,
}

/// How batches run; shared by `batch run` and `layer run`.
#[derive(Debug, Args)]
pub struct RunOptions {
    /// Fast mode (adds each batch's fast_env).
    #[arg(long, conflicts_with = "no_fast")]
    pub fast: bool,
    /// Full mode even where the layer says fast.
    #[arg(long)]
    pub no_fast: bool,
    /// Full `sha256:` image ID (default: CIBOX_IMAGE, then image.id).
    #[arg(long)]
    pub image: Option<String>,
    /// Source tree to test (default: the git toplevel).
    #[arg(long)]
    pub source: Option<PathBuf>,
    /// Where reports go (default: cibox-reports).
    #[arg(long)]
    pub reports: Option<PathBuf>,
    /// Cleanup scope (default on GitHub Actions gh-RUNID-ATTEMPT, else local-USER).
    #[arg(long, env = "CIBOX_SCOPE")]
    pub scope: Option<String>,
    /// How long to wait for GPUs (default: the manifest's gpu.wait; `0s`: try once).
    #[arg(long, value_name = "DUR")]
    pub wait: Option<crate::units::Span>,
    /// Run batches whose GPU needs fit at the same time (the widest, then the longest
    /// expected first).
    #[arg(long)]
    pub parallel: bool,
    /// Run only part K of N, the batches split by expected time so that every part
    /// takes about as long (`--partition 2/4`; one runner per part).
    #[arg(long, value_name = "K/N")]
    pub partition: Option<String>,
    /// An earlier run's timings.json (or a folder of downloaded ones): its times win
    /// over est_time in --partition and --parallel. Repeatable.
    #[arg(long, value_name = "PATH")]
    pub timings: Vec<PathBuf>,
    /// Run each batch that did not pass again, up to N more times (default: each
    /// batch's `retries`, else 0).
    #[arg(long, value_name = "N")]
    pub retries: Option<u32>,
    /// After the first batch that fails the run, start no more (the rest are recorded
    /// as not run); a layer's `fail_fast` says so too.
    #[arg(long)]
    pub fail_fast: bool,
}

#[derive(Debug, Subcommand)]
pub enum LayerCommand {
    /// Run every batch of a layer, continuing after failures.
    Run(LayerRunArgs),
}

#[derive(Debug, Args)]
pub struct LayerRunArgs {
    /// The layer to run.
    pub layer: String,
    #[command(flatten)]
    pub options: RunOptions,
}

#[cfg(test)]
mod tests {
    #[test]
    fn command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}

#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// Only this scope's containers (default: every scope).
    #[arg(long, env = "CIBOX_SCOPE")]
    pub scope: Option<String>,
}

#[derive(Debug, Args)]
pub struct CapacityArgs {
    /// Layers to judge (default: all).
    #[arg(long)]
    pub layer: Vec<String>,
    /// Exit 4 unless this layer can be admitted now.
    #[arg(long)]
    pub require: Option<String>,
    /// Write `<layer>_ready` to $GITHUB_OUTPUT.
    #[arg(long)]
    pub github_output: bool,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ChangedArgs {
    #[command(subcommand)]
    pub command: Option<ChangedCommand>,
    /// Base revision.
    #[arg(long)]
    pub base: Option<String>,
    /// Head revision (default HEAD).
    #[arg(long)]
    pub head: Option<String>,
    /// Write `matrix` and `has_tests` to $GITHUB_OUTPUT.
    #[arg(long)]
    pub github_output: bool,
    /// List test files that no batch runs.
    #[arg(long)]
    pub unregistered: bool,
}

#[derive(Debug, Subcommand)]
pub enum ChangedCommand {
    /// Run test files, each as a batch in its own container with its own GPU count, as
    /// `changed.run` says. The files come as the JSON matrix `cibox changed` prints (or
    /// one of its entries), from a file or a variable: never on the command line, so a
    /// workflow never pastes a file name into a shell.
    Run(ChangedRunArgs),
}

#[derive(Debug, Args)]
pub struct ChangedRunArgs {
    /// A file holding the matrix (`{"include": [{"test_file", "num_gpus"}, …]}`), a
    /// list of entries, or one entry.
    #[arg(
        long,
        value_name = "PATH",
        conflicts_with = "matrix_env",
        required_unless_present = "matrix_env"
    )]
    pub matrix_file: Option<PathBuf>,
    /// An environment variable holding it (in a workflow:
    /// `env: {CIBOX_MATRIX: "${{ toJSON(matrix) }}"}`).
    #[arg(long, value_name = "VAR")]
    pub matrix_env: Option<String>,
    #[command(flatten)]
    pub options: RunOptions,
}

#[derive(Debug, Subcommand)]
pub enum WorkflowCommand {
    /// Render `*.yml.j2` templates (GitHub workflows and Buildkite pipelines) with the
    /// manifest as context.
    Render {
        /// Write nothing; show a diff and exit 1 if any output is stale.
        #[arg(long)]
        check: bool,
        /// Write nothing; print the one rendered output named (its file name, or its
        /// path from the manifest's folder) on stdout, as `buildkite-agent pipeline
        /// upload` reads it.
        #[arg(long, value_name = "OUTPUT", conflicts_with = "check")]
        print: Option<String>,
        /// With --print: a pipeline that follows the diff from REV's merge base with
        /// --head: each batch `selected` as `cibox changed` selects its `changes` groups.
        #[arg(long, value_name = "REV", requires = "print")]
        base: Option<String>,
        /// With --base: the diff's head (default HEAD).
        #[arg(long, value_name = "REV", requires = "base")]
        head: Option<String>,
    },
    /// Refuse workflows that let outsiders' code or text onto self-hosted runners.
    Lint(LintArgs),
}

#[derive(Debug, Args)]
pub struct LintArgs {
    /// Workflow files or folders (their *.yml and *.yaml). Default: the manifest's
    /// `workflows.dir`, or without a manifest `.github/workflows` of the repository.
    pub paths: Vec<PathBuf>,
    /// How findings are printed: `text` (one line each), `json` (as `--json`), or
    /// `sarif` (SARIF 2.1.0, for GitHub code scanning).
    #[arg(long, value_enum)]
    pub format: Option<LintFormat>,
}

/// The output formats of `workflow lint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LintFormat {
    Text,
    Json,
    Sarif,
}

#[derive(Debug, Args)]
pub struct ReproduceArgs {
    /// The run record to replay.
    pub result: PathBuf,
    /// Print the plan only.
    #[arg(long)]
    pub dry_run: bool,
}

/// The subcommand `bad` was likely meant to be, among those of the command the words
/// before it name (`batch rnu` → `run`): clap suggests only what is close by its own
/// measure, which misses swapped letters.
pub fn suggest_subcommand(words: &[String], bad: &str) -> Option<String> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    for w in words.iter().take_while(|w| *w != bad) {
        if let Some(sub) = cmd.find_subcommand(w) {
            cmd = sub.clone();
        }
    }
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| s.get_name().to_string())
        .map(|name| (strsim::damerau_levenshtein(bad, &name), name))
        .filter(|(d, name)| *d <= (name.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, name)| name)
}
