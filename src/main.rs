use std::process::ExitCode;

use clap::Parser;

use cibox::{cli::Cli, cmd, console, exit};

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
    console::init(cli.verbose);
    let json = cli.json;
    let code = match cmd::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            console::error(&e, e.details());
            if json {
                console::json_error(&e.to_string(), e.details(), e.exit_code());
            }
            e.exit_code()
        }
    };
    if cibox::gpu::probe::stuck_in_driver() {
        // A thread is stuck in the driver or the loader, maybe holding the loader's
        // lock that the exit handlers take: leave without them.
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: ends the process at once; nothing runs after it.
        unsafe { nix::libc::_exit(i32::from(code)) }
    }
    ExitCode::from(code)
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
            // clap's "did you mean": kept, on the same line.
            let tip = text
                .lines()
                .map(str::trim)
                .find_map(|l| l.strip_prefix("tip: "))
                .map(|t| format!("; {t}"))
                .unwrap_or_default();
            let first = format!("{first}{tip}");
            let first = first.as_str();
            eprintln!(
                "cibox: {} {first} (see `cibox --help`)",
                console::paint("error:", console::Colour::Red)
            );
            // `--json` was asked for, though the line it is on did not parse.
            let json = std::env::args()
                .skip(1)
                .take_while(|a| a != "--")
                .any(|a| a == "--json");
            if json {
                console::json_error(first, &[], exit::USAGE);
            }
            exit::USAGE
        }
    }
}
