use std::process::ExitCode;

use clap::Parser;

use cibox::{cli::Cli, cmd, exit, report};

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`cibox batch list | head`) like other Unix tools,
    // instead of panicking on the failed write.
    // SAFETY: restoring the default disposition before any thread exists.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error(e)),
    };
    report::init(cli.verbose);
    match cmd::dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            report::error(&e, e.details());
            ExitCode::from(e.exit_code())
        }
    }
}

/// Help and version go to stdout with 0; a usage error is one line and exit 2.
fn usage_error(e: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                exit::USAGE
            } else {
                exit::SUCCESS
            }
        }
        _ => {
            let text = e.render().to_string();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("bad command line")
                .trim_start_matches("error: ");
            eprintln!("cibox: error: {first} (see `cibox --help`)");
            exit::USAGE
        }
    }
}
