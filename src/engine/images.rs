//! The engine's images: looked up, pulled by digest, loaded from archives, built,
//! removed and saved. Never a pull by tag.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use bollard::query_parameters::{
    BuildImageOptionsBuilder, CreateImageOptionsBuilder, ImportImageOptionsBuilder,
};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::{Engine, EngineError, ImageDetails, is_not_found, reason};

/// What a Dockerfile build is asked.
pub struct BuildSpec<'a> {
    /// The Dockerfile's name in the context.
    pub dockerfile: &'a str,
    pub labels: &'a HashMap<String, String>,
    /// `ARG` values.
    pub build_args: &'a HashMap<String, String>,
    pub tag: &'a str,
    pub no_cache: bool,
    /// The stage to build (`--target`); the last one when `None`.
    pub target: Option<&'a str>,
    /// The network every `RUN` step gets (`networkmode`: `none`, `host`); `None`: the
    /// engine's default.
    pub network: Option<&'a str>,
}

impl Engine {
    /// Looks an image up by its full ID, or by any reference the engine understands
    /// (right after a load that reported a tag). Never pulls; `None` when it is not
    /// present.
    pub fn inspect(&self, reference: &str) -> Result<Option<ImageDetails>, EngineError> {
        match self.rt.block_on(self.docker.inspect_image(reference)) {
            Ok(img) => Ok(Some(ImageDetails {
                id: img.id.unwrap_or_default(),
                onbuild: img
                    .config
                    .as_ref()
                    .and_then(|c| c.on_build.as_ref())
                    .map_or(0, Vec::len),
                labels: img.config.and_then(|c| c.labels).unwrap_or_default(),
                repo_tags: img.repo_tags.unwrap_or_default(),
                layers: img.root_fs.and_then(|r| r.layers).unwrap_or_default(),
                platform: (
                    img.os.unwrap_or_default(),
                    img.architecture.unwrap_or_default(),
                    img.variant.unwrap_or_default(),
                ),
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(Self::api("inspecting image", e)),
        }
    }

    /// Pulls `repository@digest` from its registry (`POST /images/create`), as the
    /// docker CLI asks for a digest: the repository, and the digest as the tag. A
    /// registry that does not have it, or refuses, is `Rejected`; one that cannot be
    /// reached is an `Api` failure.
    pub fn pull(&self, repository: &str, digest: &str) -> Result<(), EngineError> {
        let action = format!("pulling {repository}@{digest}");
        self.rt.block_on(async {
            let opts = CreateImageOptionsBuilder::default()
                .from_image(repository)
                .tag(digest)
                .build();
            let mut progress = self.docker.create_image(Some(opts), None, None);
            while let Some(item) = progress.next().await {
                match item {
                    Ok(info) => {
                        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                            return Err(EngineError::Rejected {
                                action: action.clone(),
                                reason: detail,
                            });
                        }
                    }
                    Err(e) => {
                        let text = reason(&e);
                        let missing = is_not_found(&e)
                            || text.contains("manifest unknown")
                            || text.contains("not found");
                        return Err(if missing {
                            EngineError::Rejected {
                                action: action.clone(),
                                reason: text,
                            }
                        } else {
                            EngineError::Api {
                                action: action.clone(),
                                reason: text,
                            }
                        });
                    }
                }
            }
            Ok(())
        })
    }

    /// Streams a docker-archive into the engine (`POST /images/load`) and returns what
    /// it reports loading: image IDs (`sha256:…`) or references (`name:tag`). The
    /// archive is read on a thread of its own, in 256 KiB chunks, as the engine takes it.
    pub fn load(&self, archive: Box<dyn Read + Send>) -> Result<Vec<String>, EngineError> {
        let body = super::streamed(archive);
        self.rt.block_on(async {
            let opts = ImportImageOptionsBuilder::default().quiet(true).build();
            let mut progress = self.docker.import_image_stream(opts, body, None);
            let mut loaded = Vec::new();
            while let Some(item) = progress.next().await {
                let info = item.map_err(|e| EngineError::Rejected {
                    action: "loading the archive".into(),
                    reason: reason(&e),
                })?;
                for text in info.stream.iter().chain(info.status.iter()) {
                    for line in text.lines() {
                        if let Some(id) = line.trim().strip_prefix("Loaded image ID: ") {
                            loaded.push(id.trim().to_string());
                        } else if let Some(r) = line.trim().strip_prefix("Loaded image: ") {
                            loaded.push(r.trim().to_string());
                        }
                    }
                }
            }
            Ok(loaded)
        })
    }

    /// Builds a Dockerfile with the classic builder from a tar of its context, as `spec`
    /// says, and tags the result so it is not garbage as a dangling image. Returns the
    /// new image's ID.
    pub fn build(
        &self,
        context_tar: std::fs::File,
        spec: &BuildSpec<'_>,
        mut on_output: impl FnMut(&str),
    ) -> Result<String, EngineError> {
        let mut opts = BuildImageOptionsBuilder::default()
            .dockerfile(spec.dockerfile)
            .t(spec.tag)
            .labels(spec.labels)
            .buildargs(spec.build_args)
            .rm(true)
            .forcerm(true)
            .nocache(spec.no_cache)
            .target(spec.target.unwrap_or_default());
        if let Some(network) = spec.network {
            opts = opts.networkmode(network);
        }
        let opts = opts.build();
        let id = self.rt.block_on(async {
            // Streamed from disk: a rootfs context can be hundreds of megabytes.
            let body = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(context_tar));
            let mut stream =
                self.docker
                    .build_image(opts, None, Some(bollard::body_try_stream(body)));
            let mut id = None;
            let mut last_lines: Vec<String> = Vec::new();
            while let Some(item) = stream.next().await {
                let info = item.map_err(|e| EngineError::Rejected {
                    action: "building the image".into(),
                    reason: reason(&e),
                })?;
                if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                    return Err(EngineError::Rejected {
                        action: "building the image".into(),
                        reason: detail,
                    });
                }
                if let Some(text) = info.stream.as_deref() {
                    on_output(text);
                    last_lines.extend(text.lines().map(str::to_string));
                    if let Some(rest) = text.trim().strip_prefix("Successfully built ") {
                        id.get_or_insert(rest.trim().to_string());
                    }
                }
                if let Some(aux) = info.aux.and_then(|a| a.id) {
                    id = Some(aux);
                }
            }
            id.ok_or_else(|| EngineError::Rejected {
                action: "building the image".into(),
                reason: format!(
                    "the engine reported no image ID; last output: {}",
                    last_lines.last().map(String::as_str).unwrap_or("none")
                ),
            })
        })?;
        // The classic builder's "Successfully built" gives a short ID; resolve it.
        match self.inspect(&id)? {
            Some(img) => Ok(img.id),
            None => Err(EngineError::Rejected {
                action: "building the image".into(),
                reason: format!("built image {id} is not present afterwards"),
            }),
        }
    }

    /// Pushes `repository:tag` (a name of a local image) to its registry with
    /// `credentials`, and returns the digest the registry gave it (`sha256:…`). A
    /// registry that refuses is `Rejected`; one that cannot be reached, `Api`.
    pub fn push(
        &self,
        repository: &str,
        tag: &str,
        credentials: Option<bollard::auth::DockerCredentials>,
    ) -> Result<String, EngineError> {
        let action = format!("pushing {repository}:{tag}");
        let opts = bollard::query_parameters::PushImageOptionsBuilder::default()
            .tag(tag)
            .build();
        self.rt.block_on(async {
            let mut progress = self.docker.push_image(repository, Some(opts), credentials);
            let mut digest = None;
            while let Some(item) = progress.next().await {
                let info = item.map_err(|e| {
                    let text = reason(&e);
                    if matches!(e, bollard::errors::Error::DockerStreamError { .. })
                        || text.contains("denied")
                        || text.contains("unauthorized")
                    {
                        EngineError::Rejected {
                            action: action.clone(),
                            reason: text,
                        }
                    } else {
                        EngineError::Api {
                            action: action.clone(),
                            reason: text,
                        }
                    }
                })?;
                if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                    return Err(EngineError::Rejected {
                        action: action.clone(),
                        reason: detail,
                    });
                }
                // `TAG: digest: sha256:… size: N`, the push's last line.
                if let Some(status) = info.status.as_deref()
                    && let Some((_, rest)) = status.split_once("digest: ")
                {
                    digest = rest.split_whitespace().next().map(str::to_string);
                }
            }
            digest.ok_or_else(|| EngineError::Rejected {
                action: action.clone(),
                reason: "the registry named no digest for what was pushed".into(),
            })
        })
    }

    /// Takes the name `repo:tag` away from its image. Never removes the image: it is
    /// refused unless the image has another name (the engine would remove an image
    /// with no name left).
    pub fn untag(&self, name: &str) -> Result<(), EngineError> {
        let Some(found) = self.inspect(name)? else {
            return Ok(());
        };
        if !found
            .repo_tags
            .iter()
            .any(|t| t != name && t != "<none>:<none>")
        {
            return Err(EngineError::Rejected {
                action: format!("removing the name {name}"),
                reason: "it is the image's only name".into(),
            });
        }
        let opts = bollard::query_parameters::RemoveImageOptions {
            force: false,
            noprune: true,
            platforms: None,
        };
        self.rt
            .block_on(self.docker.remove_image(name, Some(opts), None))
            .map(|_| ())
            .map_err(|e| Self::api("removing a name", e))
    }

    /// Names image `id` `repo:tag` (moving the tag from whatever image had it).
    pub fn tag(&self, id: &str, repo: &str, tag: &str) -> Result<(), EngineError> {
        let opts = bollard::query_parameters::TagImageOptionsBuilder::default()
            .repo(repo)
            .tag(tag)
            .build();
        self.rt
            .block_on(self.docker.tag_image(id, Some(opts)))
            .map_err(|e| Self::api("tagging an image", e))
    }

    /// Removes an image by ID (not forced: an image a container uses stays).
    pub fn remove_image(&self, id: &str) -> Result<(), EngineError> {
        self.rt
            .block_on(self.docker.remove_image(
                id,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            ))
            .map(|_| ())
            .map_err(|e| Self::api("removing an image", e))
    }

    /// Removes exactly this image, by ID: not forced (one a container uses, or one with
    /// images built on it, stays), no parent pruned with it (those may be another
    /// build's), and only when each of its tags is one `may_untag` allows (so an image
    /// someone else named stays). Says whether it is gone.
    pub fn remove_image_only(
        &self,
        id: &str,
        may_untag: impl Fn(&str) -> bool,
    ) -> Result<bool, EngineError> {
        match self.inspect(id)? {
            None => return Ok(true),
            Some(found)
                if found
                    .repo_tags
                    .iter()
                    .any(|t| t != "<none>:<none>" && !may_untag(t)) =>
            {
                return Ok(false);
            }
            Some(_) => {}
        }
        let opts = bollard::query_parameters::RemoveImageOptions {
            force: false,
            noprune: true,
            platforms: None,
        };
        match self
            .rt
            .block_on(self.docker.remove_image(id, Some(opts), None))
        {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(true),
            // In use, built on, or named more than once: it stays.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => Ok(false),
            Err(e) => Err(Self::api("removing an image", e)),
        }
    }

    /// The images (intermediate ones included) carrying the label `key`, with its
    /// value.
    pub fn images_labelled(&self, key: &str) -> Result<Vec<(String, String)>, EngineError> {
        let opts = bollard::query_parameters::ListImagesOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![key.to_string()],
            )])),
            ..Default::default()
        };
        let list = self
            .rt
            .block_on(self.docker.list_images(Some(opts)))
            .map_err(|e| Self::api("listing images", e))?;
        Ok(list
            .into_iter()
            .filter_map(|i| i.labels.get(key).map(|v| (i.id.clone(), v.clone())))
            .collect())
    }

    /// Streams `docker save` of one image into `sink` as the engine sends it; returns
    /// the number of bytes. What `sink` refuses ends it.
    pub fn save_into(&self, id: &str, sink: &mut dyn std::io::Write) -> Result<u64, EngineError> {
        self.rt.block_on(async {
            let mut stream = self.docker.export_image(id);
            let mut written = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| Self::api("saving the image", e))?;
                written += chunk.len() as u64;
                sink.write_all(&chunk).map_err(|e| EngineError::Io {
                    action: "reading the engine's save".into(),
                    reason: e.to_string(),
                })?;
            }
            Ok(written)
        })
    }

    /// Writes `docker save` of one image to `to`, atomically (a temp file renamed into
    /// place), and returns the number of bytes written.
    pub fn save(&self, id: &str, to: &Path) -> Result<u64, EngineError> {
        let io = |e: std::io::Error| EngineError::Io {
            action: format!("writing {}", to.display()),
            reason: e.to_string(),
        };
        let dir = to
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            ".{}.cibox-partial-{}",
            to.file_name().and_then(|n| n.to_str()).unwrap_or("image"),
            std::process::id()
        ));
        let result = self.rt.block_on(async {
            let mut file = tokio::fs::File::create(&tmp).await.map_err(io)?;
            let mut stream = self.docker.export_image(id);
            let mut written = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| Self::api("saving the image", e))?;
                written += chunk.len() as u64;
                file.write_all(&chunk).await.map_err(io)?;
            }
            file.sync_all().await.map_err(io)?;
            tokio::fs::rename(&tmp, to).await.map_err(io)?;
            Ok(written)
        });
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}
