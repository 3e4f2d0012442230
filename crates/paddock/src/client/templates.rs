//! `paddock template build | ls | get | rm`.
//!
//! A build streams its steps (`application/x-ndjson`): on a terminal a progress bar over its
//! layers, otherwise one plain line per step on stderr; the template's name goes to stdout at the
//! end (its JSON with `--json`). A failed build prints the server's one-line reason and exits 1.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use futures_util::StreamExt as _;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use paddock_types::api::{
    BuildTemplateRequest, ReadyCheck, TemplateBuildEvent, TemplateInfo, TemplateList, TemplateStart,
};
use paddock_types::ByteSize;
use reqwest::Method;

use super::{print_json, ApiClient, Table};
use crate::cli::StartArgs;

/// Most bytes of one event line read before it is refused (a template's info is a few KiB).
const MAX_LINE: usize = 1 << 20;

/// What `paddock template build` builds from.
pub struct BuildSource {
    pub from: Option<String>,
    pub recipe: Option<String>,
    pub build_args: std::collections::BTreeMap<String, String>,
    pub network: Option<paddock_types::NetworkPolicy>,
    /// The build context's directory.
    pub context: Option<std::path::PathBuf>,
}

/// The most bytes of a recipe file read: what the server accepts.
const MAX_RECIPE: u64 = paddock_types::recipe::MAX_RECIPE_BYTES as u64;

/// Reads a recipe file (`-`: stdin), bounded (also the server's reader of configured recipes).
pub fn read_recipe(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    let mut text = String::new();
    let read = if path == std::path::Path::new("-") {
        std::io::stdin().take(MAX_RECIPE + 1).read_to_string(&mut text)
    } else {
        std::fs::File::open(path)
            .with_context(|| format!("cannot open the recipe {}", path.display()))?
            .take(MAX_RECIPE + 1)
            .read_to_string(&mut text)
    };
    read.with_context(|| format!("cannot read the recipe {}", path.display()))?;
    if text.len() as u64 > MAX_RECIPE {
        anyhow::bail!("the recipe {} is larger than {MAX_RECIPE} bytes", path.display());
    }
    Ok(text)
}

pub async fn build(
    client: &ApiClient,
    name: String,
    source: BuildSource,
    start: StartArgs,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if source.network.is_some() && source.recipe.is_none() {
        anyhow::bail!("network flags are for a recipe's steps (give --file)");
    }
    let start = start_of(start)?;
    if let (Some(dir), Some(recipe)) = (&source.context, &source.recipe) {
        let (query, body, _temporary) = super::template_upload::context_request(
            dir.clone(),
            recipe,
            name,
            &source.build_args,
            source.network.as_ref(),
            start,
        )
        .await?;
        let request = client
            .request(Method::POST, &["v1", "templates", "import"])
            .query(&query)
            .header(reqwest::header::CONTENT_TYPE, "application/x-tar")
            .header(reqwest::header::ACCEPT, "application/x-ndjson")
            .body(body);
        return follow(client, request, json).await;
    }
    if let Some(upload) = source
        .from
        .as_deref()
        .map(super::template_upload::local_source)
        .transpose()?
        .flatten()
    {
        if !source.build_args.is_empty() {
            anyhow::bail!("build arguments are for a recipe (give --file)");
        }
        let (query, body, _temporary) = upload.into_request(name, start).await?;
        let request = client
            .request(Method::POST, &["v1", "templates", "import"])
            .query(&query)
            .header(reqwest::header::CONTENT_TYPE, "application/x-tar")
            .header(reqwest::header::ACCEPT, "application/x-ndjson")
            .body(body);
        return follow(client, request, json).await;
    }
    let request = BuildTemplateRequest {
        name,
        from: source.from,
        recipe: source.recipe,
        build_args: source.build_args,
        network: source.network,
        start,
    };
    let request = client
        .request(Method::POST, &["v1", "templates"])
        .header(reqwest::header::ACCEPT, "application/x-ndjson")
        .json(&request);
    follow(client, request, json).await
}

/// Sends a build and follows its events to the end.
async fn follow(
    client: &ApiClient,
    request: reqwest::RequestBuilder,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let response = client.send(request).await?;
    let mut body = response.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    let mut progress = BuildProgress::new();
    loop {
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let event: TemplateBuildEvent =
                serde_json::from_slice(&line).context("the server sent an unreadable build event")?;
            match event {
                TemplateBuildEvent::Done { template } => {
                    progress.finish();
                    if json {
                        print_json(&template)?;
                    } else {
                        println!("{}", template.name);
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                TemplateBuildEvent::Error { code, message } => {
                    progress.finish();
                    anyhow::bail!("{message} ({})", code.as_str());
                }
                other => progress.show(&other),
            }
        }
        if pending.len() > MAX_LINE {
            anyhow::bail!("the server sent a build event longer than {MAX_LINE} bytes");
        }
        match body.next().await {
            Some(chunk) => pending.extend_from_slice(&chunk.context("the build's stream broke off")?),
            None => {
                progress.finish();
                anyhow::bail!("the build's stream ended without a result; `paddock template ls` shows whether it finished")
            }
        }
    }
}

/// The request's start command from the flags (shell commands run with `/bin/sh -c`).
fn start_of(args: StartArgs) -> anyhow::Result<Option<TemplateStart>> {
    let shell = |script: String| vec!["/bin/sh".to_owned(), "-c".to_owned(), script];
    let ready = match (args.ready_port, args.ready_command) {
        (None, None) => None,
        (port, command) => Some(ReadyCheck {
            port,
            command: command.map(shell),
            timeout_secs: args.ready_timeout,
        }),
    };
    let command = args.start_command.map(shell);
    if !args.start && command.is_none() {
        if ready.is_some() {
            anyhow::bail!("a readiness check needs a start command: give --start or --start-command");
        }
        return Ok(None);
    }
    Ok(Some(TemplateStart { command, ready }))
}

/// A bar over the layers on a terminal, plain lines otherwise.
struct BuildProgress {
    bar: Option<ProgressBar>,
    terminal: bool,
}

impl BuildProgress {
    fn new() -> Self {
        Self {
            bar: None,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn show(&mut self, event: &TemplateBuildEvent) {
        match event {
            TemplateBuildEvent::Pulling { reference } => self.say(format!("pulling {reference}")),
            TemplateBuildEvent::Received { format, bytes } => self.say(format!(
                "received a {format} archive of {}",
                ByteSize::bytes(*bytes)
            )),
            TemplateBuildEvent::Pulled {
                digest,
                layers,
                bytes,
            } => {
                self.say(format!(
                    "pulled {digest}: {layers} layers, {}",
                    ByteSize::bytes(*bytes)
                ));
                if self.terminal {
                    let bar =
                        ProgressBar::with_draw_target(Some(*layers as u64), ProgressDrawTarget::stderr());
                    bar.set_style(
                        ProgressStyle::with_template("unpacking {bar:30} {pos}/{len} layers {msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_bar()),
                    );
                    self.bar = Some(bar);
                }
            }
            TemplateBuildEvent::Layer {
                index,
                of,
                digest,
                size,
                cached,
            } => {
                let how = if *cached { "cached" } else { "unpacked" };
                let short = digest.strip_prefix("sha256:").unwrap_or(digest);
                let short = &short[..short.len().min(12)];
                match &self.bar {
                    Some(bar) => {
                        bar.set_message(format!("{short} {how}"));
                        bar.inc(1);
                    }
                    None => eprintln!(
                        "layer {}/{of} {short} ({}) {how}",
                        index + 1,
                        ByteSize::bytes(*size)
                    ),
                }
            }
            TemplateBuildEvent::Step {
                index,
                of,
                instruction,
                cached,
            } => {
                let how = if *cached { " (cached)" } else { "" };
                self.say(format!("step {}/{of}: {instruction}{how}", index + 1));
            }
            TemplateBuildEvent::Log { text, .. } => match &self.bar {
                Some(bar) => bar.suspend(|| eprint!("{text}")),
                None => eprint!("{text}"),
            },
            TemplateBuildEvent::Done { .. } | TemplateBuildEvent::Error { .. } => {}
        }
    }

    fn say(&self, line: String) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

pub async fn list(client: &ApiClient, json: bool) -> anyhow::Result<ExitCode> {
    let list: TemplateList = client
        .json(client.request(Method::GET, &["v1", "templates"]))
        .await?;
    if json {
        return print_json(&list).map(|()| ExitCode::SUCCESS);
    }
    let mut table = Table::new(["NAME", "ID", "SOURCE", "SIZE", "LAYERS", "CREATED"]);
    for t in &list.templates {
        table.row([
            t.name.clone(),
            t.id.clone().unwrap_or_else(|| "-".into()),
            t.source.clone().unwrap_or_else(|| "(server)".into()),
            t.size_bytes
                .map_or_else(|| "-".into(), |b| ByteSize::bytes(b).to_string()),
            if t.id.is_some() {
                t.layers.len().to_string()
            } else {
                "-".into()
            },
            t.created_at.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    table.print();
    Ok(ExitCode::SUCCESS)
}

pub async fn get(client: &ApiClient, template: &str, json: bool) -> anyhow::Result<ExitCode> {
    let info: TemplateInfo = client
        .json(client.request(Method::GET, &["v1", "templates", template]))
        .await?;
    if json {
        print_json(&info)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("name:      {}", info.name);
    println!(
        "id:        {}",
        info.id.as_deref().unwrap_or("- (one of the server's)")
    );
    if let Some(source) = &info.source {
        println!("source:    {source}");
    }
    if let Some(digest) = &info.digest {
        println!("digest:    {digest}");
    }
    if let Some(size) = info.size_bytes {
        println!(
            "size:      {} in {} layers",
            ByteSize::bytes(size),
            info.layers.len()
        );
    }
    if let Some(created) = &info.created_at {
        println!("created:   {created}");
    }
    if let Some(config) = &info.config {
        for e in &config.env {
            println!("env:       {e}");
        }
        if let Some(w) = &config.working_dir {
            println!("workdir:   {w}");
        }
        if let Some(u) = &config.user {
            println!("user:      {u}");
        }
        if let Some(cmd) = config.start_command() {
            println!("image cmd: {}", cmd.join(" "));
        }
    }
    if let Some(start) = &info.start {
        println!(
            "start:     {}",
            start.command.as_deref().unwrap_or_default().join(" ")
        );
        if let Some(ready) = &start.ready {
            match (&ready.port, &ready.command) {
                (Some(port), _) => println!("ready:     port {port} within {}s", ready.timeout_secs),
                (None, Some(c)) => println!("ready:     `{}` within {}s", c.join(" "), ready.timeout_secs),
                (None, None) => {}
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn remove(client: &ApiClient, templates: &[String]) -> anyhow::Result<ExitCode> {
    for template in templates {
        client
            .send(client.request(Method::DELETE, &["v1", "templates", template]))
            .await?;
        println!("{template}");
    }
    Ok(ExitCode::SUCCESS)
}
