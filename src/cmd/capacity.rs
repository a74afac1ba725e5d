//! `cibox capacity`: which layers could be admitted right now ([`crate::capacity`]).

use super::context::Context;
use crate::capacity::{self, Asked};
use crate::console;
use crate::error::Result;
use crate::exit;

pub fn run(
    ctx: &Context,
    layers: &[String],
    require: Option<&str>,
    github_output: bool,
) -> Result<u8> {
    let m = ctx.manifest()?;
    let asked = Asked { layers, require };
    asked.check(&m)?;
    let mut outputs = match github_output {
        true => Some(crate::github::Outputs::open()?),
        false => None,
    };
    let verdicts = capacity::judge(&m, &ctx.host_policy()?, &asked)?;
    if let Some(out) = &mut outputs {
        let pairs = verdicts.outputs();
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        out.write(&pairs)?;
    }
    if ctx.json {
        console::json(&verdicts.to_json());
    } else {
        print!("{}", verdicts.render());
    }
    // The required layer is judged whether or not --layer listed it.
    verdicts.required_admitted()?;
    Ok(exit::SUCCESS)
}
