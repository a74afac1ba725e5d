//! Reading `env:` and `with:` maps, which are either literal maps or one expression (an
//! expression's values are unknown until the run, so readers here see none).

use github_actions_models::common::expr::LoE;
use github_actions_models::common::{Env, EnvValue};

/// Every name and value of a literal map, values as text.
pub(crate) fn env_text(env: &LoE<Env>) -> Vec<(&str, String)> {
    match env {
        LoE::Expr(_) => Vec::new(),
        LoE::Literal(map) => map
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_string()))
            .collect(),
    }
}

/// A value by its exact name (`with:` inputs, shell variables).
pub(crate) fn env_value<'a>(env: &'a LoE<Env>, name: &str) -> Option<&'a EnvValue> {
    match env {
        LoE::Expr(_) => None,
        LoE::Literal(map) => map.get(name),
    }
}

/// An env value by name, as `env.NAME` finds it (context paths are lower-cased).
pub(crate) fn env_value_ci<'a>(env: &'a LoE<Env>, name: &str) -> Option<&'a EnvValue> {
    match env {
        LoE::Expr(_) => None,
        LoE::Literal(map) => map
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v),
    }
}
