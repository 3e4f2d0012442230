//! Local sources of `paddock template build --from`, uploaded to `POST /v1/templates/import`:
//! `docker-archive:FILE[:TAG]` (a `docker save` archive), `oci-archive:FILE[:REF]` (an OCI image
//! layout archive), `oci:DIR[:REF]` (an OCI image layout directory, packed here) and
//! `rootfs:DIR|FILE` (a root file system: a directory packed here, or a tar of one).
//!
//! A directory is packed into a temporary file first (a tar member's size comes before its
//! bytes), without following symlinks. The server checks everything it receives; this module
//! does not inspect what it sends, and never reads past what it packs (an OCI layout's
//! `oci-layout`, `index.json` and `blobs/`).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use paddock_types::api::{ImportTemplateQuery, TemplateStart};
use reqwest::Body;
use tokio_util::io::ReaderStream;

/// What `--from` names on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Upload {
    /// An archive file sent as it is (`image` or `rootfs`).
    File {
        path: PathBuf,
        format: &'static str,
        image: Option<String>,
    },
    /// An OCI image layout directory.
    OciDir { dir: PathBuf, image: Option<String> },
    /// A root file system directory.
    RootfsDir { dir: PathBuf },
}

/// The local source `from` names, or `None` when it is a registry reference.
pub(super) fn local_source(from: &str) -> anyhow::Result<Option<Upload>> {
    let Some((transport, rest)) = from.split_once(':') else {
        return Ok(None);
    };
    let upload = match transport {
        "docker-archive" | "oci-archive" => {
            let (path, image) = split_reference(rest)?;
            Upload::File {
                path,
                format: "image",
                image,
            }
        }
        "oci" => {
            let (dir, image) = split_reference(rest)?;
            Upload::OciDir { dir, image }
        }
        "rootfs" => {
            let path = PathBuf::from(rest);
            let meta = std::fs::metadata(&path).with_context(|| format!("cannot read {rest}"))?;
            if meta.is_dir() {
                Upload::RootfsDir { dir: path }
            } else {
                Upload::File {
                    path,
                    format: "rootfs",
                    image: None,
                }
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(upload))
}

/// `PATH` or `PATH:REF`, as skopeo writes them (a docker tag holds a `:` itself, so the path is
/// the shortest prefix before a `:` that exists).
fn split_reference(spec: &str) -> anyhow::Result<(PathBuf, Option<String>)> {
    if spec.is_empty() {
        anyhow::bail!("give a path after the transport (for example oci-archive:image.tar)");
    }
    if Path::new(spec).exists() {
        return Ok((spec.into(), None));
    }
    for (i, _) in spec.match_indices(':') {
        let (path, reference) = (&spec[..i], &spec[i + 1..]);
        if !path.is_empty() && Path::new(path).exists() && !reference.is_empty() {
            return Ok((path.into(), Some(reference.to_owned())));
        }
    }
    anyhow::bail!("{spec}: no such file or directory")
}

impl Upload {
    /// The request's query and body; the temporary file a packed directory went to lives as long
    /// as the returned handle.
    pub(super) async fn into_request(
        self,
        name: String,
        start: Option<TemplateStart>,
    ) -> anyhow::Result<(ImportTemplateQuery, Body, Option<tempfile::NamedTempFile>)> {
        let start = start.as_ref().map(json).transpose()?;
        let (format, image, file, temporary) = match self {
            Upload::File { path, format, image } => {
                let file = tokio::fs::File::open(&path)
                    .await
                    .with_context(|| format!("cannot open {}", path.display()))?;
                (format, image, file, None)
            }
            Upload::OciDir { dir, image } => {
                let packed = pack(dir, Packing::OciLayout).await?;
                let file = reopen(&packed).await?;
                ("image", image, file, Some(packed))
            }
            Upload::RootfsDir { dir } => {
                let packed = pack(dir, Packing::Rootfs).await?;
                let file = reopen(&packed).await?;
                ("rootfs", None, file, Some(packed))
            }
        };
        let query = ImportTemplateQuery {
            name,
            format: Some(format.to_owned()),
            image,
            start,
            ..ImportTemplateQuery::default()
        };
        let body = Body::wrap_stream(ReaderStream::with_capacity(file, 64 * 1024));
        Ok((query, body, temporary))
    }
}

/// Where the recipe goes in a packed build context (after the directory's own files: it wins over
/// one of the same name).
const RECIPE_MEMBER: &str = ".paddock-recipe";

/// A query value as JSON.
fn json<T: serde::Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    serde_json::to_string(value).context("failed to encode the request")
}

/// The request of a recipe build with the build context `dir`.
pub(super) async fn context_request(
    dir: PathBuf,
    recipe: &str,
    name: String,
    build_args: &std::collections::BTreeMap<String, String>,
    network: Option<&paddock_types::NetworkPolicy>,
    start: Option<TemplateStart>,
) -> anyhow::Result<(ImportTemplateQuery, Body, Option<tempfile::NamedTempFile>)> {
    let packed = pack(dir, Packing::Context(recipe.to_owned())).await?;
    let file = reopen(&packed).await?;
    let query = ImportTemplateQuery {
        name,
        format: Some("context".to_owned()),
        image: None,
        start: start.as_ref().map(json).transpose()?,
        recipe: Some(RECIPE_MEMBER.to_owned()),
        build_args: (!build_args.is_empty()).then(|| json(build_args)).transpose()?,
        network: network.map(json).transpose()?,
    };
    let body = Body::wrap_stream(ReaderStream::with_capacity(file, 64 * 1024));
    Ok((query, body, Some(packed)))
}

/// What of a directory is packed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Packing {
    /// `oci-layout`, `index.json` and `blobs/`.
    OciLayout,
    /// Everything, as `./...`.
    Rootfs,
    /// Everything, then the recipe text as [`RECIPE_MEMBER`].
    Context(String),
}

async fn reopen(file: &tempfile::NamedTempFile) -> anyhow::Result<tokio::fs::File> {
    tokio::fs::File::open(file.path())
        .await
        .context("cannot read the packed archive")
}

/// Packs `dir` into a new temporary file, never following a symlink.
async fn pack(dir: PathBuf, packing: Packing) -> anyhow::Result<tempfile::NamedTempFile> {
    tokio::task::spawn_blocking(move || {
        let meta = std::fs::metadata(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
        if !meta.is_dir() {
            anyhow::bail!("{} is not a directory", dir.display());
        }
        let file = tempfile::NamedTempFile::new().context("cannot make a temporary file")?;
        let mut builder = tar::Builder::new(std::io::BufWriter::new(file.reopen()?));
        builder.follow_symlinks(false);
        let packed = match packing {
            Packing::OciLayout => {
                for name in ["oci-layout", "index.json"] {
                    let path = dir.join(name);
                    if !path.is_file() {
                        anyhow::bail!("{} is not an OCI image layout (no {name})", dir.display());
                    }
                    builder.append_path_with_name(&path, name)?;
                }
                builder.append_dir_all("blobs", dir.join("blobs"))
            }
            Packing::Rootfs => builder.append_dir_all(".", &dir),
            Packing::Context(recipe) => builder.append_dir_all(".", &dir).and_then(|()| {
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(recipe.len() as u64);
                header.set_mode(0o644);
                builder.append_data(&mut header, RECIPE_MEMBER, recipe.as_bytes())
            }),
        };
        packed.with_context(|| format!("cannot pack {}", dir.display()))?;
        builder
            .into_inner()
            .and_then(|mut w| std::io::Write::flush(&mut w))
            .with_context(|| format!("cannot pack {}", dir.display()))?;
        Ok(file)
    })
    .await
    .context("packing stopped")?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_at_the_first_existing_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let archive = dir.path().join("img.tar");
        std::fs::write(&archive, b"x").expect("write");
        let spec = format!("docker-archive:{}:app:v1", archive.display());
        assert_eq!(
            local_source(&spec).expect("parsed"),
            Some(Upload::File {
                path: archive.clone(),
                format: "image",
                image: Some("app:v1".into()),
            })
        );
        let spec = format!("oci-archive:{}", archive.display());
        assert_eq!(
            local_source(&spec).expect("parsed"),
            Some(Upload::File {
                path: archive.clone(),
                format: "image",
                image: None,
            })
        );
        let spec = format!("oci:{}:v2", dir.path().display());
        assert_eq!(
            local_source(&spec).expect("parsed"),
            Some(Upload::OciDir {
                dir: dir.path().to_owned(),
                image: Some("v2".into()),
            })
        );
        let spec = format!("rootfs:{}", dir.path().display());
        assert_eq!(
            local_source(&spec).expect("parsed"),
            Some(Upload::RootfsDir {
                dir: dir.path().to_owned()
            })
        );
        // Registry references are not local sources, whatever their colons.
        assert_eq!(local_source("python:3.12").expect("parsed"), None);
        assert_eq!(
            local_source("registry.example:5000/a/b:v1").expect("parsed"),
            None
        );
        assert_eq!(local_source("alpine").expect("parsed"), None);
        // A missing file is one clear error.
        let e = local_source("oci-archive:/nonexistent/img.tar").expect_err("missing");
        assert!(e.to_string().contains("no such file"), "{e}");
    }
}
