//! One module per command family; [`dispatch`] routes a parsed command line to it.

mod artifact;
mod batch;
mod cache;
mod capacity;
mod changed;
mod context;
mod doctor;
mod error;
mod gpu;
mod host;
mod image;
mod init;
mod reproduce;
mod run;
mod slurm;
mod workflow;

use crate::cli::{
    ArtifactCommand, BatchCommand, CacheCommand, Cli, Command, GpuCommand, HostCommand,
    ImageCommand, LayerCommand, WorkflowCommand,
};
use crate::error::Result;
use context::Context;
use error::CommandError;

/// Runs the command and returns its exit code.
pub fn dispatch(cli: Cli) -> Result<u8> {
    let ctx = Context {
        manifest_path: cli.manifest,
        json: cli.json,
        policy: Default::default(),
    };
    match cli.command {
        Command::Image(c) => image_command(&ctx, c),
        Command::Doctor => doctor::run(&ctx),
        Command::Init => init::init(&ctx),
        Command::Batch(BatchCommand::List(a)) => batch::list(&ctx, &a),
        Command::Batch(BatchCommand::Run(a)) => {
            batch::run(&ctx, &a.names, a.layer.as_deref(), &a.options)
        }
        Command::Layer(LayerCommand::Run(a)) => batch::run(&ctx, &[], Some(&a.layer), &a.options),
        Command::Gpu(GpuCommand::Status) => gpu::status(&ctx),
        Command::Gpu(GpuCommand::Exec(args)) => gpu::exec(&ctx, args),
        Command::Gpu(GpuCommand::Fake(args)) => gpu::fake(&args),
        Command::Cleanup(a) => batch::cleanup(&ctx, a.scope.as_deref()),
        Command::Capacity(a) => {
            capacity::run(&ctx, &a.layer, a.require.as_deref(), a.github_output)
        }
        Command::Changed(a) => changed::run(&ctx, &a),
        Command::Workflow(WorkflowCommand::Render {
            check,
            print,
            base,
            head,
        }) => {
            let diff = base.map(|b| (b, head.unwrap_or_else(|| "HEAD".into())));
            workflow::render(&ctx, check, print.as_deref(), diff)
        }
        Command::Workflow(WorkflowCommand::Lint(args)) => {
            workflow::lint(&ctx, &args.paths, args.format)
        }
        Command::Reproduce(a) => reproduce::run(&ctx, &a.result, a.dry_run),
        Command::Cache(CacheCommand::List { all_projects }) => cache::list(&ctx, all_projects),
        Command::Cache(CacheCommand::Inspect { name, pull_request }) => {
            cache::inspect(&ctx, &name, pull_request)
        }
        Command::Cache(CacheCommand::Prune { names, all }) => cache::prune(&ctx, &names, all),
        Command::Artifact(ArtifactCommand::Verify { artifacts, reports }) => {
            artifact::verify(&ctx, &artifacts, reports)
        }
        Command::Artifact(ArtifactCommand::Digest { batch, reports }) => {
            artifact::digest(&batch, reports)
        }
        Command::Host(HostCommand::Setup { lock_dir }) => host::setup(&ctx, lock_dir),
        Command::Host(HostCommand::Policy) => host::policy(&ctx),
        Command::Confine(a) => Ok(crate::process::confine::supervisor(
            crate::process::confine::SupervisorArgs {
                owner: a.owner,
                report_fd: a.report_fd,
                grace: std::time::Duration::from_millis(a.grace_ms),
                interactive: a.interactive,
                subreaper: a.subreaper,
                argv: a.command,
            },
        )),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "cibox", &mut std::io::stdout());
            Ok(crate::exit::SUCCESS)
        }
        Command::Man { dir } => man(dir),
        Command::Watchdog { container } => Ok(crate::run::watch_container(&container)),
        Command::RenderTemplate {
            flavor,
            template,
            selection_base,
            selection_head,
            changed,
            collected_stdin,
        } => {
            let selection = selection_base.zip(selection_head).map(|(base, head)| {
                crate::workflow::context::Selection {
                    base,
                    head,
                    groups: changed,
                }
            });
            workflow::render_template(
                &ctx,
                &flavor,
                &template,
                selection.as_ref(),
                collected_stdin,
            )
        }
        Command::SlurmNode { job } => Ok(slurm::node(&ctx, &job)),
        Command::HostFolders { me, paths } => Ok(crate::engine::report_host_folders(me, &paths)),
        Command::SlurmWatchdog { name, srun } => Ok(crate::run::slurm::watch_job(&name, srun)),
    }
}

/// `cibox image …`.
fn image_command(ctx: &Context, command: ImageCommand) -> Result<u8> {
    match command {
        ImageCommand::Lockset { name } => image::lockset(ctx, name.as_deref()),
        ImageCommand::Verify { id, name } => image::verify(ctx, id, name.as_deref()),
        ImageCommand::Load {
            from,
            no_verify,
            name,
        } => image::load(ctx, &from, !no_verify, name.as_deref()),
        ImageCommand::Build {
            name,
            check,
            secrets,
        } => image::build(ctx, name.as_deref(), check, &secrets),
        ImageCommand::Push { id, to, name } => image::push(ctx, &id, &to, name.as_deref()),
        ImageCommand::Id { from, name } => image::id(ctx, &from, name.as_deref()),
        ImageCommand::Fetch { reference, name } => image::fetch(ctx, reference, name.as_deref()),
        ImageCommand::Save { id, to } => image::save(ctx, &id, &to),
        ImageCommand::Qualify {
            id,
            reports,
            source,
            scope,
        } => image::qualify(ctx, &id, reports, source, scope),
    }
}

/// `cibox man [DIR]`: the manual's top page on standard output, or every page in DIR.
fn man(dir: Option<std::path::PathBuf>) -> Result<u8> {
    let cmd = <Cli as clap::CommandFactory>::command();
    match dir {
        // The pages the top page names, so none of them is missing.
        Some(dir) => {
            clap_mangen::generate_to(cmd, &dir).map_err(CommandError::ManPage)?;
            crate::console::info(format!("wrote the manual's pages in {}", dir.display()));
        }
        None => clap_mangen::Man::new(cmd)
            .render(&mut std::io::stdout())
            .map_err(CommandError::ManPage)?,
    }
    Ok(crate::exit::SUCCESS)
}
