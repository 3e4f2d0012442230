//! Recipes: the subset of the Dockerfile language a template can be built from, parsed into plain
//! data ([`parse_recipe`]).
//!
//! A recipe is one `FROM` (an image, optionally after `ARG`s it may use) followed by `RUN`, `ENV`,
//! `WORKDIR`, `USER`, `LABEL`, `EXPOSE`, `CMD`, `ENTRYPOINT`, `COPY` and `ADD`. The parser follows
//! docker's rules for what it accepts: case-insensitive keywords, `#` comment lines, line continuation
//! with a trailing `\` (comment and blank lines inside a continuation are skipped), the `syntax` and
//! `escape` parser directives at the top, shell and JSON (exec) forms, `ENV`/`LABEL` pairs with
//! quotes and escapes, and `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR:+alt}` substitution of `ARG`
//! and `ENV` values in every instruction but `RUN`, `CMD` and `ENTRYPOINT` (whose shell expands
//! them when it runs). A `RUN` carries the `ARG` values in scope (`arg_env`), which docker sets in
//! its environment, so a changed build argument changes its cache key.
//!
//! It refuses, with the line and a reason ([`RecipeError`]), everything else: other instructions
//! (`HEALTHCHECK`, `VOLUME`, `SHELL`, `ONBUILD`, ...), multi-stage recipes, `FROM scratch`, flags
//! other than `COPY`/`ADD --chown`, sources outside the build context or from a URL, an escape
//! character other than `\`, and input over [`MAX_RECIPE_BYTES`] or [`MAX_INSTRUCTIONS`].
//!
//! It does no I/O: it does not resolve the image, read the build context, expand wildcards in
//! sources or run anything. Values are as the recipe states them: the base image's own environment
//! is not known here, so a `$VAR` it alone defines substitutes to nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::iter::Peekable;
use std::str::Chars;

use serde::{Deserialize, Serialize};

use crate::ImageConfig;

/// Largest recipe text accepted, in bytes.
pub const MAX_RECIPE_BYTES: usize = 1 << 20;
/// Most instructions (including `ARG` and `FROM`) in a recipe.
pub const MAX_INSTRUCTIONS: usize = 1000;
/// Largest value one substituted word may grow to (Linux's limit on one environment string).
const MAX_WORD_BYTES: usize = 128 << 10;
/// Most bytes all substituted words (and the `ARG` values passed to `RUN`s) may add up to.
const MAX_EXPANDED_BYTES: usize = 16 << 20;
/// Deepest nesting of `${VAR:-${...}}`.
const MAX_NESTING: usize = 16;
/// The shell that runs the shell form of `RUN`, `CMD` and `ENTRYPOINT`.
const SHELL: [&str; 2] = ["/bin/sh", "-c"];

/// A parsed recipe: the base image and the steps applied on top of it, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// The base image reference, as written after `FROM` with `ARG` values substituted.
    pub from: String,
    /// The instructions after `FROM` (`ARG`s are not steps: their values are substituted).
    pub steps: Vec<Step>,
}

/// One instruction of a recipe and where it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// 1-based line of the instruction's first line in the recipe text.
    pub line: usize,
    /// What it does.
    pub instruction: Instruction,
}

/// A command of `RUN`, `CMD` or `ENTRYPOINT`.
///
/// On the wire: `{"shell":"make all"}` or `{"exec":["make","all"]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// Shell form: the text, run by `/bin/sh -c` (variables are the shell's to expand).
    Shell(String),
    /// Exec form (a JSON array): the argument vector, run as is.
    Exec(Vec<String>),
}

impl Command {
    /// The argument vector that runs it: the exec form as is, the shell form as
    /// `/bin/sh -c TEXT` (docker's default shell).
    pub fn argv(&self) -> Vec<String> {
        match self {
            Self::Shell(text) => SHELL
                .iter()
                .map(|s| (*s).to_owned())
                .chain([text.clone()])
                .collect(),
            Self::Exec(argv) => argv.clone(),
        }
    }
}

/// What a step does. Paths and values are final: variables substituted, quotes removed.
///
/// On the wire: internally tagged by `kind` (`{"kind":"workdir","path":"/app"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Instruction {
    /// `RUN`: run a command in the image being built.
    Run {
        /// The command.
        command: Command,
        /// The `ARG` values in scope, which docker sets in the command's environment (an `ENV` of
        /// the same name wins, and is left out here). Part of the step's cache key, so a changed
        /// build argument reruns the commands after its `ARG`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        arg_env: Vec<(String, String)>,
    },
    /// `ENV`: set environment variables, in order.
    Env {
        /// `(name, value)` pairs.
        vars: Vec<(String, String)>,
    },
    /// `WORKDIR`: the working directory of later steps and of the image.
    Workdir {
        /// Absolute and normalised (no `.`, `..`, empty or trailing components).
        path: String,
    },
    /// `USER`: the user of later `RUN`s and of the image (`name`, `uid`, `name:group`, ...).
    User {
        /// The user as written (substituted).
        user: String,
    },
    /// `LABEL`: metadata pairs.
    Label {
        /// `(key, value)` pairs.
        labels: Vec<(String, String)>,
    },
    /// `EXPOSE`: ports the image documents as listened on.
    Expose {
        /// `PORT/tcp` or `PORT/udp`, the port in 1-65535 without leading zeros.
        ports: Vec<String>,
    },
    /// `CMD`: the image's default command.
    Cmd {
        /// The command.
        command: Command,
    },
    /// `ENTRYPOINT`: the image's entrypoint.
    Entrypoint {
        /// The command.
        command: Command,
    },
    /// `COPY`: copy files of the build context into the image.
    Copy {
        /// Relative paths inside the build context, normalised (`.` for the whole context); they
        /// may hold wildcards, which are the caller's to expand.
        sources: Vec<String>,
        /// Absolute and normalised (a relative destination is resolved against the `WORKDIR`); it
        /// ends with `/` when it names a directory to copy into.
        dest: String,
        /// `--chown=user[:group]`, if given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chown: Option<String>,
    },
    /// `ADD`: as `COPY` (local sources only; unpacking archives is the caller's to do).
    Add {
        /// As for [`Instruction::Copy`].
        sources: Vec<String>,
        /// As for [`Instruction::Copy`].
        dest: String,
        /// As for [`Instruction::Copy`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chown: Option<String>,
    },
}

/// Why a recipe is refused: the 1-based line of the offending instruction and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct RecipeError {
    /// 1-based line (the first line of a continued instruction; 1 for the recipe as a whole).
    pub line: usize,
    /// What is wrong, for a human.
    pub message: String,
}

impl Recipe {
    /// The image config of the result: `base` with the recipe's `ENV`, `WORKDIR`, `USER`, `EXPOSE`,
    /// `CMD` and `ENTRYPOINT` applied in order, as docker applies them.
    ///
    /// `ENV` replaces an existing `NAME=` entry in place (or appends); `EXPOSE` adds ports not yet
    /// listed; shell-form commands become `/bin/sh -c TEXT`; `ENTRYPOINT` clears the base image's
    /// `CMD` (but not one this recipe set before it), and a later `CMD` keeps the entrypoint.
    pub fn image_config(&self, base: &ImageConfig) -> ImageConfig {
        let mut config = ConfigApplier::new(base.clone(), false);
        for step in &self.steps {
            config.apply(&step.instruction);
        }
        config.into_config()
    }
}

/// Applies a recipe's instructions to an image config one at a time, as [`Recipe::image_config`]
/// does for all of them (for a caller that needs the config between steps, such as the defaults a
/// `RUN` runs with). Indexed, so that a recipe with many variables or ports costs no quadratic time.
#[derive(Debug, Clone)]
pub struct ConfigApplier {
    config: ImageConfig,
    /// Whether the recipe set `CMD` already: an `ENTRYPOINT` clears only the base image's.
    cmd_set: bool,
    env_index: BTreeMap<String, usize>,
    exposed: BTreeSet<String>,
}

impl ConfigApplier {
    /// Starts from `config`; `cmd_set`: the recipe's steps before this point set `CMD`.
    pub fn new(config: ImageConfig, cmd_set: bool) -> Self {
        let mut env_index: BTreeMap<String, usize> = BTreeMap::new();
        for (i, entry) in config.env.iter().enumerate() {
            if let Some((name, _)) = entry.split_once('=') {
                env_index.entry(name.to_owned()).or_insert(i);
            }
        }
        let exposed = config.exposed_ports.iter().cloned().collect();
        Self {
            config,
            cmd_set,
            env_index,
            exposed,
        }
    }

    /// Applies one instruction (`RUN`, `LABEL`, `COPY` and `ADD` change nothing).
    pub fn apply(&mut self, instruction: &Instruction) {
        let config = &mut self.config;
        match instruction {
            Instruction::Env { vars } => {
                for (name, value) in vars {
                    let entry = format!("{name}={value}");
                    match self.env_index.get(name) {
                        Some(&i) => config.env[i] = entry,
                        None => {
                            self.env_index.insert(name.clone(), config.env.len());
                            config.env.push(entry);
                        }
                    }
                }
            }
            Instruction::Workdir { path } => config.working_dir = Some(path.clone()),
            Instruction::User { user } => config.user = Some(user.clone()),
            Instruction::Expose { ports } => {
                for port in ports {
                    if self.exposed.insert(port.clone()) {
                        config.exposed_ports.push(port.clone());
                    }
                }
            }
            Instruction::Cmd { command } => {
                config.cmd = Some(command.argv());
                self.cmd_set = true;
            }
            Instruction::Entrypoint { command } => {
                config.entrypoint = Some(command.argv());
                if !self.cmd_set {
                    config.cmd = None;
                }
            }
            Instruction::Run { .. }
            | Instruction::Label { .. }
            | Instruction::Copy { .. }
            | Instruction::Add { .. } => {}
        }
    }

    /// The config so far.
    pub fn config(&self) -> &ImageConfig {
        &self.config
    }

    /// The config.
    pub fn into_config(self) -> ImageConfig {
        self.config
    }
}

impl Step {
    /// A canonical text of the instruction, for the caller's step cache keys: the same for any two
    /// spellings of the same step (keyword case, spacing between arguments, quoting of `ENV` values,
    /// `./` in sources, ...) and different for steps that differ in effect. The line is left out.
    /// A shell-form command is kept as written (trimmed), since its spacing can matter to the shell.
    pub fn cache_text(&self) -> String {
        let mut s = String::new();
        match &self.instruction {
            Instruction::Run { command, arg_env } => {
                s.push_str("RUN ");
                command_text(&mut s, command);
                if !arg_env.is_empty() {
                    s.push_str(" ARG_ENV ");
                    pairs_text(&mut s, arg_env);
                }
            }
            Instruction::Env { vars } => {
                s.push_str("ENV ");
                pairs_text(&mut s, vars);
            }
            Instruction::Workdir { path } => {
                s.push_str("WORKDIR ");
                quote(&mut s, path);
            }
            Instruction::User { user } => {
                s.push_str("USER ");
                quote(&mut s, user);
            }
            Instruction::Label { labels } => {
                s.push_str("LABEL ");
                pairs_text(&mut s, labels);
            }
            Instruction::Expose { ports } => {
                s.push_str("EXPOSE ");
                list_text(&mut s, ports);
            }
            Instruction::Cmd { command } => {
                s.push_str("CMD ");
                command_text(&mut s, command);
            }
            Instruction::Entrypoint { command } => {
                s.push_str("ENTRYPOINT ");
                command_text(&mut s, command);
            }
            Instruction::Copy { sources, dest, chown } | Instruction::Add { sources, dest, chown } => {
                s.push_str(if matches!(self.instruction, Instruction::Copy { .. }) {
                    "COPY "
                } else {
                    "ADD "
                });
                s.push_str("CHOWN ");
                match chown {
                    Some(c) => quote(&mut s, c),
                    None => s.push('-'),
                }
                s.push(' ');
                list_text(&mut s, sources);
                s.push(' ');
                quote(&mut s, dest);
            }
        }
        s
    }
}

/// Appends `text` quoted unambiguously (JSON-like: `"`, `\` and control characters escaped).
fn quote(s: &mut String, text: &str) {
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(s, "\\u{{{:x}}}", u32::from(c));
            }
            c => s.push(c),
        }
    }
    s.push('"');
}

fn list_text(s: &mut String, items: &[String]) {
    s.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        quote(s, item);
    }
    s.push(']');
}

fn pairs_text(s: &mut String, pairs: &[(String, String)]) {
    s.push('[');
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        quote(s, k);
        s.push('=');
        quote(s, v);
    }
    s.push(']');
}

fn command_text(s: &mut String, command: &Command) {
    match command {
        Command::Shell(text) => {
            s.push_str("shell ");
            quote(s, text);
        }
        Command::Exec(argv) => {
            s.push_str("exec ");
            list_text(s, argv);
        }
    }
}

/// Parses a recipe. `build_args` gives values to the recipe's `ARG`s (over their defaults); a
/// build argument the recipe does not declare is ignored, as docker does.
///
/// `ARG`s before `FROM` are usable in `FROM` only; to use one after it, declare it again without a
/// value (`ARG NAME`), as in docker. After `FROM`, an `ENV` of the same name wins over an `ARG`.
pub fn parse_recipe(text: &str, build_args: &BTreeMap<String, String>) -> Result<Recipe, RecipeError> {
    if text.len() > MAX_RECIPE_BYTES {
        return Err(RecipeError {
            line: 1,
            message: format!(
                "the recipe is {} bytes, more than the limit of {MAX_RECIPE_BYTES} (1 MiB)",
                text.len()
            ),
        });
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines = logical_lines(text)?;
    let mut parser = Parser {
        build_args,
        meta_args: BTreeMap::new(),
        args: BTreeMap::new(),
        env: BTreeMap::new(),
        no_env: BTreeMap::new(),
        from: None,
        workdir: "/".to_owned(),
        steps: Vec::new(),
        budget: MAX_EXPANDED_BYTES,
    };
    for (count, (line, content)) in lines.iter().enumerate() {
        if count >= MAX_INSTRUCTIONS {
            return Err(RecipeError {
                line: *line,
                message: format!("the recipe has more than {MAX_INSTRUCTIONS} instructions"),
            });
        }
        let step = parser
            .instruction(content)
            .map_err(|message| RecipeError { line: *line, message })?;
        if let Some(instruction) = step {
            parser.steps.push(Step {
                line: *line,
                instruction,
            });
        }
    }
    match parser.from {
        Some(from) => Ok(Recipe {
            from,
            steps: parser.steps,
        }),
        None => Err(RecipeError {
            line: 1,
            message: if lines.is_empty() {
                "the recipe is empty: it needs a FROM instruction".to_owned()
            } else {
                "the recipe has no FROM instruction".to_owned()
            },
        }),
    }
}

/// Splits the text into instructions: `(first line, text)` with continuations joined and comment
/// and blank lines dropped, after handling the parser directives at the top.
fn logical_lines(text: &str) -> Result<Vec<(usize, String)>, RecipeError> {
    let mut out = Vec::new();
    let mut directives_open = true;
    let mut seen_directives: Vec<String> = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.split('\n').enumerate() {
        let n = i + 1;
        let raw = raw.strip_suffix('\r').unwrap_or(raw);
        if raw.contains('\0') {
            return Err(RecipeError {
                line: n,
                message: "the recipe contains a NUL character".to_owned(),
            });
        }
        if directives_open {
            match directive(raw) {
                Some((name, value)) => {
                    if seen_directives.contains(&name) {
                        return Err(RecipeError {
                            line: n,
                            message: format!("the {name} parser directive is given twice"),
                        });
                    }
                    if name == "escape" && value != "\\" {
                        return Err(RecipeError {
                            line: n,
                            message: format!(
                                "escape parser directive {value:?} is not supported: the escape character is always \\"
                            ),
                        });
                    }
                    seen_directives.push(name);
                    continue;
                }
                None => directives_open = false,
            }
        }
        let trimmed = raw.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (body, continued) = match current {
            None => strip_continuation(trimmed),
            Some(_) => strip_continuation(raw),
        };
        let (start, mut joined) = current.take().unwrap_or((n, String::new()));
        joined.push_str(body);
        if continued {
            current = Some((start, joined));
        } else {
            out.push((start, joined));
        }
    }
    out.extend(current);
    Ok(out)
}

/// A parser directive (`# name=value`, name `syntax`, `escape` or `check`), lower-cased name.
fn directive(line: &str) -> Option<(String, &str)> {
    let rest = line.strip_prefix('#')?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(rest.len());
    let name = rest[..end].to_ascii_lowercase();
    let value = rest[end..].trim_start().strip_prefix('=')?.trim();
    (["syntax", "escape", "check"].contains(&name.as_str()) && !value.is_empty()).then_some((name, value))
}

/// The line without a trailing `\` (and blanks after it), and whether it had one.
fn strip_continuation(line: &str) -> (&str, bool) {
    match line.trim_end_matches([' ', '\t']).strip_suffix('\\') {
        Some(body) => (body, true),
        None => (line, false),
    }
}

/// The state of a parse: the variables defined so far and the current working directory.
struct Parser<'a> {
    build_args: &'a BTreeMap<String, String>,
    /// `ARG`s declared before `FROM` (with a value).
    meta_args: BTreeMap<String, String>,
    /// `ARG`s declared after `FROM` (with a value).
    args: BTreeMap<String, String>,
    /// `ENV`s so far.
    env: BTreeMap<String, String>,
    /// No `ENV` is visible before `FROM`.
    no_env: BTreeMap<String, String>,
    from: Option<String>,
    workdir: String,
    steps: Vec<Step>,
    /// Bytes substitution may still produce.
    budget: usize,
}

impl Parser<'_> {
    /// Parses one instruction; `None` for `ARG` and `FROM`, which are not steps.
    fn instruction(&mut self, text: &str) -> Result<Option<Instruction>, String> {
        let text = text.trim();
        let (keyword, args) = match text.split_once(char::is_whitespace) {
            Some((k, a)) => (k, a.trim()),
            None => (text, ""),
        };
        let upper = keyword.to_ascii_uppercase();
        match upper.as_str() {
            "ARG" => return self.arg(args).map(|()| None),
            "FROM" => return self.from(args).map(|()| None),
            "RUN" | "ENV" | "WORKDIR" | "USER" | "LABEL" | "EXPOSE" | "CMD" | "ENTRYPOINT" | "COPY"
            | "ADD" => {}
            other => return Err(unsupported(other, keyword)),
        }
        if self.from.is_none() {
            return Err(format!(
                "{upper} before FROM: FROM must be the first instruction (only ARG may come before it)"
            ));
        }
        let instruction = match upper.as_str() {
            "RUN" => {
                no_flags(args, "RUN")?;
                let command = parse_command(args, "RUN")?;
                if matches!(&command, Command::Exec(argv) if argv.is_empty()) {
                    return Err("RUN needs a command".to_owned());
                }
                let arg_env: Vec<(String, String)> = self
                    .args
                    .iter()
                    .filter(|(name, _)| !self.env.contains_key(*name))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                self.charge(arg_env.iter().map(|(k, v)| k.len() + v.len()).sum())?;
                Instruction::Run { command, arg_env }
            }
            "CMD" => Instruction::Cmd {
                command: parse_command(args, "CMD")?,
            },
            "ENTRYPOINT" => Instruction::Entrypoint {
                command: parse_command(args, "ENTRYPOINT")?,
            },
            "ENV" => {
                let vars = self.pairs(args, "ENV")?;
                for (name, _) in &vars {
                    if name.contains(['=', '\0'])
                        || name.contains(char::is_whitespace)
                        || name.contains(char::is_control)
                    {
                        return Err(format!("invalid ENV name {name:?}"));
                    }
                }
                self.env.extend(vars.iter().cloned());
                Instruction::Env { vars }
            }
            "LABEL" => Instruction::Label {
                labels: self.pairs(args, "LABEL")?,
            },
            "WORKDIR" => {
                let path = self.expand(args)?;
                if path.is_empty() {
                    return Err("WORKDIR needs a path".to_owned());
                }
                self.workdir = resolve_path(&self.workdir, &path);
                Instruction::Workdir {
                    path: self.workdir.clone(),
                }
            }
            "USER" => {
                let user = self.expand(args)?;
                if user.is_empty() {
                    return Err("USER needs a user".to_owned());
                }
                if user.contains(|c: char| c.is_whitespace() || c.is_control()) {
                    return Err(format!(
                        "invalid USER {user:?}: use name, uid, name:group or uid:gid"
                    ));
                }
                Instruction::User { user }
            }
            "EXPOSE" => {
                let mut ports = Vec::new();
                for word in split_words(args) {
                    for port in self.expand(word)?.split_whitespace() {
                        ports.push(parse_port(port)?);
                    }
                }
                if ports.is_empty() {
                    return Err("EXPOSE needs a port".to_owned());
                }
                Instruction::Expose { ports }
            }
            _ => {
                let add = upper == "ADD";
                let (sources, dest, chown) = self.copy(args, &upper, add)?;
                if add {
                    Instruction::Add { sources, dest, chown }
                } else {
                    Instruction::Copy { sources, dest, chown }
                }
            }
        };
        Ok(Some(instruction))
    }

    fn arg(&mut self, args: &str) -> Result<(), String> {
        let words = split_words(args);
        if words.is_empty() {
            return Err("ARG needs a name: ARG NAME or ARG NAME=default".to_owned());
        }
        for word in words {
            let (name, default) = match word.split_once('=') {
                Some((name, default)) => (name, Some(default)),
                None => (word, None),
            };
            if !is_name(name) {
                return Err(format!("invalid ARG name {name:?}: use letters, digits and _"));
            }
            let default = default.map(|d| self.expand(d)).transpose()?;
            let in_stage = self.from.is_some();
            let value = self
                .build_args
                .get(name)
                .cloned()
                .or(default)
                .or_else(|| in_stage.then(|| self.meta_args.get(name).cloned()).flatten());
            if let Some(value) = value {
                let scope = if in_stage {
                    &mut self.args
                } else {
                    &mut self.meta_args
                };
                scope.insert(name.to_owned(), value);
            }
        }
        Ok(())
    }

    fn from(&mut self, args: &str) -> Result<(), String> {
        if self.from.is_some() {
            return Err("a second FROM: multi-stage recipes are not supported".to_owned());
        }
        no_flags(args, "FROM")?;
        let words = split_words(args);
        match words.as_slice() {
            [_] => {}
            [_, as_, _] if as_.eq_ignore_ascii_case("as") => {
                return Err("FROM ... AS: multi-stage recipes are not supported".to_owned());
            }
            [] => return Err("FROM needs an image".to_owned()),
            _ => return Err("FROM takes one image reference".to_owned()),
        }
        let image = self.expand(args)?;
        if image.is_empty() {
            return Err("FROM names no image (its variables are empty)".to_owned());
        }
        if image.contains(|c: char| c.is_whitespace() || c.is_control()) {
            return Err(format!("invalid image reference {image:?}"));
        }
        if image.eq_ignore_ascii_case("scratch") {
            return Err("FROM scratch is not supported: use an image".to_owned());
        }
        self.from = Some(image);
        Ok(())
    }

    /// `NAME=value ...` or the legacy `NAME value with spaces`, substituted.
    fn pairs(&mut self, args: &str, keyword: &str) -> Result<Vec<(String, String)>, String> {
        let words = split_words(args);
        let Some(first) = words.first() else {
            return Err(format!("{keyword} needs NAME=value"));
        };
        let mut raw = Vec::new();
        if first.contains('=') {
            for word in &words {
                match word.split_once('=') {
                    Some(pair) => raw.push(pair),
                    None => return Err(format!("{keyword}: expected NAME=value, found {word:?}")),
                }
            }
        } else {
            let value = args[first.len()..].trim_start();
            if value.is_empty() {
                return Err(format!(
                    "{keyword} {first} needs a value (NAME=value or NAME value)"
                ));
            }
            raw.push((first, value));
        }
        // Every value is substituted with the variables as they were before this instruction.
        let mut pairs = Vec::with_capacity(raw.len());
        for (name, value) in raw {
            let name = self.expand(name)?;
            if name.is_empty() {
                return Err(format!("{keyword}: a name is empty"));
            }
            pairs.push((name, self.expand(value)?));
        }
        Ok(pairs)
    }

    /// Sources, destination and `--chown` of `COPY` and `ADD`.
    fn copy(
        &mut self,
        args: &str,
        keyword: &str,
        add: bool,
    ) -> Result<(Vec<String>, String, Option<String>), String> {
        let mut rest = args.trim_start();
        let mut chown = None;
        while rest.starts_with("--") {
            let (flag, after) = next_word(rest);
            let name = flag.split('=').next().unwrap_or(flag);
            match (name, flag.split_once('=')) {
                ("--chown", _) if chown.is_some() => return Err(format!("{keyword} --chown is given twice")),
                ("--chown", Some((_, value))) => {
                    let value = self.expand(value)?;
                    if value.is_empty() || value.contains(|c: char| c.is_whitespace() || c.is_control()) {
                        return Err(format!("invalid {keyword} --chown={value:?}: use user[:group]"));
                    }
                    chown = Some(value);
                }
                ("--chown", None) => {
                    return Err(format!("{keyword} --chown needs a value: --chown=user[:group]"))
                }
                _ => {
                    return Err(format!(
                        "unsupported flag {name:?} on {keyword} (only --chown is supported)"
                    ))
                }
            }
            rest = after.trim_start();
        }
        let rest = rest.trim_end();
        let items = match json_array(rest) {
            Some(items) => items
                .iter()
                .map(|item| self.expand(item))
                .collect::<Result<Vec<_>, _>>()?,
            None => split_words(rest)
                .into_iter()
                .map(|w| self.expand(w))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let Some((dest, sources)) = items.split_last().filter(|(_, sources)| !sources.is_empty()) else {
            return Err(format!("{keyword} needs a source and a destination"));
        };
        let sources = sources
            .iter()
            .map(|s| check_source(s, keyword, add))
            .collect::<Result<Vec<_>, _>>()?;
        if dest.is_empty() {
            return Err(format!("{keyword} destination is empty"));
        }
        if dest.contains('\0') {
            return Err(format!("{keyword} destination contains a NUL character"));
        }
        let last = dest.rsplit('/').next().unwrap_or(dest);
        let is_dir = matches!(last, "" | "." | "..");
        if sources.len() > 1 && !is_dir {
            return Err(format!(
                "{keyword} with several sources needs a directory destination ending in /"
            ));
        }
        let mut dest = resolve_path(&self.workdir, dest);
        if is_dir && dest != "/" {
            dest.push('/');
        }
        Ok((sources, dest, chown))
    }

    /// Substitutes variables in one word (quotes and escapes processed), charging the budget.
    fn expand(&mut self, raw: &str) -> Result<String, String> {
        let (env, args) = if self.from.is_some() {
            (&self.env, &self.args)
        } else {
            (&self.no_env, &self.meta_args)
        };
        let out = Expander { env, args }.word(raw)?;
        self.charge(out.len())?;
        Ok(out)
    }

    fn charge(&mut self, bytes: usize) -> Result<(), String> {
        self.budget = self.budget.checked_sub(bytes).ok_or_else(|| {
            format!("the recipe's substituted values add up to more than {MAX_EXPANDED_BYTES} bytes")
        })?;
        Ok(())
    }
}

fn unsupported(upper: &str, keyword: &str) -> String {
    let hint = match upper {
        "VOLUME" => " (a sandbox's volumes are given when it is created)",
        "MAINTAINER" => " (use LABEL)",
        "SHELL" => " (shell forms always run /bin/sh -c)",
        "HEALTHCHECK" => " (give the template a readiness check instead)",
        "ONBUILD" | "STOPSIGNAL" => "",
        _ => {
            let shown: String = keyword.chars().take(40).collect();
            return format!("unknown instruction {shown:?} is not supported");
        }
    };
    format!("{upper} is not supported{hint}")
}

/// Refuses a leading `--flag` (`RUN --mount`, `FROM --platform`).
fn no_flags(args: &str, keyword: &str) -> Result<(), String> {
    if args.starts_with("--") && args[2..].starts_with(|c: char| c.is_ascii_alphabetic()) {
        let (flag, _) = next_word(args);
        let name = flag.split('=').next().unwrap_or(flag);
        return Err(format!("unsupported flag {name:?} on {keyword}"));
    }
    Ok(())
}

/// The JSON-array (exec) form if `text` is a JSON array of strings, else the shell form (as docker,
/// which falls back to the shell form for anything else, `[ -f x ] && ...` included).
fn parse_command(text: &str, keyword: &str) -> Result<Command, String> {
    if let Some(argv) = json_array(text) {
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(format!("{keyword} contains a NUL character"));
        }
        return Ok(Command::Exec(argv));
    }
    if text.is_empty() {
        return Err(format!("{keyword} needs a command"));
    }
    Ok(Command::Shell(text.to_owned()))
}

fn json_array(text: &str) -> Option<Vec<String>> {
    text.starts_with('[')
        .then(|| serde_json::from_str(text).ok())
        .flatten()
}

/// `80`, `80/tcp`, `53/UDP` → `80/tcp`, `53/udp`.
fn parse_port(text: &str) -> Result<String, String> {
    let (number, protocol) = text.split_once('/').unwrap_or((text, "tcp"));
    let protocol = protocol.to_ascii_lowercase();
    let port = (!number.is_empty() && number.len() <= 5 && number.bytes().all(|b| b.is_ascii_digit()))
        .then(|| number.parse::<u16>().ok())
        .flatten()
        .filter(|p| *p != 0);
    match port {
        Some(port) if protocol == "tcp" || protocol == "udp" => Ok(format!("{port}/{protocol}")),
        _ => Err(format!(
            "invalid EXPOSE port {text:?}: use a port 1-65535, optionally with /tcp or /udp"
        )),
    }
}

/// A source of `COPY`/`ADD`, normalised; refused if it is a URL, absolute or leaves the context.
fn check_source(source: &str, keyword: &str, add: bool) -> Result<String, String> {
    if source.is_empty() {
        return Err(format!("{keyword} source is empty"));
    }
    if source.contains('\0') {
        return Err(format!("{keyword} source contains a NUL character"));
    }
    if source.contains("://") || (add && source.starts_with("git@")) {
        return Err(format!(
            "{keyword} source {source:?} is a URL: only files of the build context can be copied"
        ));
    }
    if source.starts_with('/') {
        return Err(format!(
            "{keyword} source {source:?} is absolute: use a path relative to the build context"
        ));
    }
    if source.split('/').any(|c| c == "..") {
        return Err(format!(
            "{keyword} source {source:?} leaves the build context (..)"
        ));
    }
    let parts: Vec<&str> = source.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    Ok(if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    })
}

/// `path` resolved against the absolute `base`, normalised.
fn resolve_path(base: &str, path: &str) -> String {
    let mut parts: Vec<&str> = if path.starts_with('/') {
        Vec::new()
    } else {
        base.split('/').collect()
    };
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    parts.retain(|p| !p.is_empty());
    format!("/{}", parts.join("/"))
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Splits on whitespace outside quotes and not escaped, keeping quotes and escapes (for
/// [`Expander::word`]).
fn split_words(text: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let (word, after) = next_word(rest);
        words.push(word);
        rest = after.trim_start();
    }
    words
}

/// The first word of `text` (which starts with no whitespace) and what follows it.
fn next_word(text: &str) -> (&str, &str) {
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match (quote, c) {
            (Some('\''), '\'') => quote = None,
            (Some('\''), _) => {}
            (_, '\\') => escaped = true,
            (Some(_), '"') => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            (None, c) if c.is_whitespace() => return (&text[..i], &text[i..]),
            _ => {}
        }
    }
    (text, "")
}

/// Docker's word processing: quotes removed (`'...'` literal, `"..."` with `\"`, `\\`, `\$` escapes
/// and substitution), `\x` outside quotes is `x`, and `$VAR`, `${VAR}`, `${VAR:-default}`,
/// `${VAR:+alt}` substituted (`ENV` values first, then `ARG`s; unset is empty).
struct Expander<'a> {
    env: &'a BTreeMap<String, String>,
    args: &'a BTreeMap<String, String>,
}

impl Expander<'_> {
    fn word(&self, raw: &str) -> Result<String, String> {
        let mut out = String::new();
        self.process(&mut raw.chars().peekable(), false, 0, &mut out)?;
        Ok(out)
    }

    fn lookup(&self, name: &str) -> &str {
        self.env
            .get(name)
            .or_else(|| self.args.get(name))
            .map_or("", String::as_str)
    }

    /// Processes up to the end (or, `in_braces`, up to the closing `}`).
    fn process(
        &self,
        it: &mut Peekable<Chars<'_>>,
        in_braces: bool,
        depth: usize,
        out: &mut String,
    ) -> Result<(), String> {
        loop {
            let Some(c) = it.next() else {
                return if in_braces {
                    Err("missing } in a ${...} substitution".to_owned())
                } else {
                    Ok(())
                };
            };
            match c {
                '}' if in_braces => return Ok(()),
                '\'' => loop {
                    match it.next() {
                        None => return Err("unterminated single quote".to_owned()),
                        Some('\'') => break,
                        Some(c) => out.push(c),
                    }
                },
                '"' => loop {
                    match it.next() {
                        None => return Err("unterminated double quote".to_owned()),
                        Some('"') => break,
                        Some('\\') => match it.peek() {
                            Some(&c @ ('"' | '$' | '\\')) => {
                                it.next();
                                out.push(c);
                            }
                            Some(_) => out.push('\\'),
                            None => {}
                        },
                        Some('$') => self.dollar(it, depth, out)?,
                        Some(c) => out.push(c),
                    }
                },
                '\\' => out.extend(it.next()),
                '$' => self.dollar(it, depth, out)?,
                c => out.push(c),
            }
        }
    }

    /// After a `$`: a substitution, or a literal `$` if no name or `{` follows.
    fn dollar(&self, it: &mut Peekable<Chars<'_>>, depth: usize, out: &mut String) -> Result<(), String> {
        let braced = it.next_if_eq(&'{').is_some();
        let mut name = String::new();
        while let Some(c) = it.next_if(|c| c.is_ascii_alphanumeric() || *c == '_') {
            name.push(c);
        }
        if !braced && !is_name(&name) {
            // `$` then nothing usable: a literal `$` (and whatever digits followed it).
            out.push('$');
            out.push_str(&name);
            return Ok(());
        }
        if braced && !is_name(&name) {
            return Err(format!("bad substitution: ${{{name}...}} needs a variable name"));
        }
        let value = self.lookup(&name);
        if braced {
            match it.next() {
                Some('}') => out.push_str(value),
                Some(':') => {
                    let modifier = it.next();
                    if !matches!(modifier, Some('-' | '+')) {
                        return Err(format!(
                            "unsupported substitution in ${{{name}:...}}: only ${{{name}:-default}} and ${{{name}:+alt}} are supported"
                        ));
                    }
                    if depth >= MAX_NESTING {
                        return Err("substitutions are nested too deeply".to_owned());
                    }
                    let mut word = String::new();
                    self.process(it, true, depth + 1, &mut word)?;
                    match (modifier, value.is_empty()) {
                        (Some('-'), true) | (Some('+'), false) => out.push_str(&word),
                        (Some('-'), false) => out.push_str(value),
                        _ => {}
                    }
                }
                None => return Err("missing } in a ${...} substitution".to_owned()),
                Some(_) => {
                    return Err(format!(
                        "unsupported substitution in ${{{name}...}}: only ${{{name}}}, ${{{name}:-default}} and ${{{name}:+alt}} are supported"
                    ))
                }
            }
        } else {
            out.push_str(value);
        }
        if out.len() > MAX_WORD_BYTES {
            return Err(format!(
                "a substituted value is longer than {MAX_WORD_BYTES} bytes"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
