//! unpinned-image (warning): a job's `container:` or `services:` image, or a `docker://`
//! step, named by tag rather than by digest. The tag's owner (or whoever takes over the
//! account or the registry) can point it at other contents at any time; on a
//! self-hosted GPU runner that image runs beside the host. Whoever starts the job.

use github_actions_models::common::DockerUses;
use github_actions_models::common::Uses;
use github_actions_models::common::expr::LoE;
use github_actions_models::workflow::job::Container;

use super::{Audit, Emit, audit_meta};
use crate::workflow::lint::facts::job::JobFacts;
use crate::workflow::lint::facts::steps::StepBody;
use crate::workflow::lint::rule::Severity;

pub(crate) struct UnpinnedImage;

audit_meta!(
    UnpinnedImage,
    "unpinned-image",
    Severity::Warning,
    "A container image not pinned by digest",
    "A job's container or service image, or a docker:// step, named by tag: whoever controls the tag controls what runs. Name it by digest (IMAGE@sha256:...)."
);

/// Whether an image is named by a full `sha256:` digest.
fn pinned(image: &DockerUses) -> bool {
    image.hash().is_some_and(|h| {
        h.strip_prefix("sha256:")
            .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    })
}

fn message(what: &str, image: &DockerUses) -> String {
    format!(
        "{what} `{}` is not pinned by digest: its tag can be moved to other contents at any time; name it as `IMAGE@sha256:…`",
        image.raw()
    )
}

impl Audit for UnpinnedImage {
    fn check_job(&self, job: &JobFacts<'_>, emit: &mut Emit<'_>) {
        let src = job.wf.src;
        let containers = job
            .job
            .container
            .iter()
            .map(|c| {
                (
                    c,
                    vec!["jobs", job.id, "container"],
                    "container image".to_string(),
                )
            })
            .chain(job.job.services.iter().map(|(name, c)| {
                (
                    c,
                    vec!["jobs", job.id, "services", name.as_str()],
                    format!("service `{name}`'s image"),
                )
            }));
        for (c, mut path, what) in containers {
            // An image an expression chooses is not known until the run.
            let image = match c {
                Container::Name(LoE::Literal(image)) => image,
                Container::Container {
                    image: LoE::Literal(image),
                    ..
                } => {
                    path.push("image");
                    image
                }
                _ => continue,
            };
            if !pinned(image) {
                emit.job(src.at(&path), message(&what, image));
            }
        }
        for step in &job.steps {
            if let StepBody::Uses(u) = step.body
                && let Uses::Docker(image) = u.uses
                && !pinned(image)
            {
                emit.step(step, step.at(src, &["uses"]), message("step image", image));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::UnpinnedImage;
    use crate::workflow::lint::audit::testing::{findings, lines};
    use crate::workflow::lint::rule::Severity;

    #[test]
    fn tags_and_bare_names_whoever_starts_the_job() {
        let f = findings(
            &UnpinnedImage,
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    container: pytorch/pytorch:2.4.0-cuda12.1\n    services:\n      cache:\n        image: redis\n    steps:\n      - uses: docker://ghcr.io/org/tool:v1\n",
        );
        assert_eq!(
            lines(&f),
            [
                "unpinned-image 5:16 job gpu: container image `pytorch/pytorch:2.4.0-cuda12.1` is not pinned by digest: its tag can be moved to other contents at any time; name it as `IMAGE@sha256:…`",
                "unpinned-image 8:16 job gpu: service `cache`'s image `redis` is not pinned by digest: its tag can be moved to other contents at any time; name it as `IMAGE@sha256:…`",
                "unpinned-image 10:15 job gpu: step image `ghcr.io/org/tool:v1` is not pinned by digest: its tag can be moved to other contents at any time; name it as `IMAGE@sha256:…`",
            ]
        );
        assert!(
            f.iter()
                .all(|x| x.rule == UnpinnedImage::RULE && x.severity == Severity::Warning)
        );
    }

    #[test]
    fn digests_and_expressions_are_not_flagged() {
        let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let f = findings(
            &UnpinnedImage,
            &format!(
                "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    container:\n      image: pytorch/pytorch@{digest}\n    services:\n      cache: {{image: \"${{{{ needs.a.outputs.image }}}}\"}}\n    steps:\n      - uses: docker://alpine@{digest}\n"
            ),
        );
        assert!(f.is_empty(), "{:#?}", lines(&f));
        // A digest that is not one.
        let f = findings(
            &UnpinnedImage,
            "on: push\njobs:\n  gpu:\n    runs-on: [self-hosted]\n    container: alpine@sha256:abc\n    steps: [{run: make}]\n",
        );
        assert_eq!(f.len(), 1, "{:#?}", lines(&f));
    }
}
