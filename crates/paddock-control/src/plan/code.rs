//! Which kernel runs a language's code contexts: the command the agent starts (with the
//! connection file it writes) and the environment every kernel gets. Policy as data: one table.
//!
//! The Python setup (`kernels/python_setup.py`) registers one more IPython display format: a
//! matplotlib figure's chart data (`application/vnd.paddock.chart+json`), in the shapes E2B's SDK
//! reads.
//!
//! What it does not do: check that the sandbox's template has the kernel (a start that fails is
//! answered `kernel_unavailable` with the kernel's own error), or start anything.

use std::collections::BTreeMap;

use paddock_protocol::kernel::{CellAround, InterruptMode};

/// A language's kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KernelSpec {
    /// The canonical language name (a context's `language`, the default context's id).
    pub(crate) language: &'static str,
    /// Other names a request may use.
    pub(crate) aliases: &'static [&'static str],
    /// The kernel's command; `{connection_file}` is the agent's.
    pub(crate) argv: &'static [&'static str],
    /// Code run silently once the kernel answers (not a cell: no execution count, no output).
    pub(crate) setup: Option<&'static str>,
    /// Variables the kernel itself needs (the sandbox's and the context's override them).
    pub(crate) env: &'static [(&'static str, &'static str)],
    /// How a running cell is interrupted (the kernelspec's `interrupt_mode`).
    pub(crate) interrupt: InterruptMode,
    /// Silent code whose end marks the end of a cell's output, for a kernel that publishes some
    /// of it after it said `idle` (see `KernelStart::barrier`).
    pub(crate) barrier: Option<&'static str>,
    /// How the kernel's language sets and restores a cell's environment variables.
    pub(crate) env_code: EnvCode,
}

/// The language a cell's environment variables are set and restored in (see [`cell_env`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EnvCode {
    /// `os.environ` (child processes and `!cmd` see it).
    Python,
    /// `Deno.env` (also `process.env`).
    Deno,
    /// Exported shell variables.
    Bash,
}

/// The kernels, in the order contexts of a new sandbox list them.
pub(crate) const KERNELS: &[KernelSpec] = &[
    KernelSpec {
        language: "python",
        aliases: &["python3", "py"],
        // No history database: every context of a sandbox would share one file in its home, and
        // concurrent or interrupted writes to it print "Session/line number was not unique" into
        // a cell's output. `In`, `Out` and `_i` stay (they are kept in memory).
        argv: &[
            "python3",
            "-m",
            "ipykernel_launcher",
            "-f",
            "{connection_file}",
            "--HistoryManager.enabled=False",
        ],
        // Charts: a matplotlib figure's data beside its PNG (`CodeResult.chart`).
        setup: Some(include_str!("kernels/python_setup.py")),
        env: &[("PYTHONUNBUFFERED", "1")],
        interrupt: InterruptMode::Signal,
        barrier: None,
        env_code: EnvCode::Python,
    },
    KernelSpec {
        language: "javascript",
        aliases: &["js", "typescript", "ts", "deno"],
        // Deno's own Jupyter kernel (JavaScript and TypeScript, top-level `await`, `npm:` imports
        // within the sandbox's network policy). `SIGINT` ends its process: it is interrupted by
        // message.
        argv: &["deno", "jupyter", "--kernel", "--conn", "{connection_file}"],
        setup: None,
        // Plain text results (no ANSI colours), no update check or permission prompt (its
        // kernel runs with every Deno permission: the sandbox is the boundary).
        env: &[
            ("NO_COLOR", "1"),
            ("DENO_NO_UPDATE_CHECK", "1"),
            ("DENO_NO_PROMPT", "1"),
        ],
        interrupt: InterruptMode::Message,
        // Deno publishes a cell's result and console output from other tasks, which can lose
        // the race with its `idle` (seen in 19 of 200 cells): a macrotask turn of its event loop
        // lets them out before the barrier ends.
        barrier: Some("await new Promise((r) => setTimeout(r, 0))"),
        env_code: EnvCode::Deno,
    },
    KernelSpec {
        language: "bash",
        aliases: &["sh", "shell"],
        argv: &["python3", "-m", "bash_kernel", "-f", "{connection_file}"],
        setup: None,
        env: &[("PYTHONUNBUFFERED", "1")],
        interrupt: InterruptMode::Signal,
        barrier: None,
        env_code: EnvCode::Bash,
    },
];

/// The language a request names (`None`: python), or `None` when no kernel runs it.
pub(crate) fn kernel_for(language: Option<&str>) -> Option<&'static KernelSpec> {
    let wanted = language.unwrap_or("python").trim().to_ascii_lowercase();
    KERNELS
        .iter()
        .find(|k| k.language == wanted || k.aliases.contains(&wanted.as_str()))
}

/// The canonical name of a language a kernel runs (`python3` → `python`), for configuration checks.
pub fn code_language(name: &str) -> Option<&'static str> {
    kernel_for(Some(name)).map(|k| k.language)
}

/// The languages kernels run, comma-separated (for errors).
pub fn code_languages() -> String {
    known_languages()
}

/// The names requests may use, for errors.
pub(crate) fn known_languages() -> String {
    KERNELS.iter().map(|k| k.language).collect::<Vec<_>>().join(", ")
}

/// A kernel's environment: a search path and a UTF-8 locale (processes of the API get only what
/// they are given) and the kernel's own variables, then the sandbox's variables, then the context's.
pub(crate) fn kernel_env(
    kernel: &KernelSpec,
    sandbox: &BTreeMap<String, String>,
    context: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        (
            "PATH".to_owned(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        ),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
    ]);
    env.extend(kernel.env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    env.extend(sandbox.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(context.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// Why a cell's variable cannot be set (its name must be a shell identifier in every language,
/// so that a cell's variables mean the same whichever kernel runs it).
pub(crate) fn check_cell_env_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(format!(
            "invalid variable name {name:?}: a cell's variables are named with letters, digits and '_' (not first a digit)"
        ))
    }
}

/// The silent code that sets `env` in the kernel before a cell and restores the previous values
/// (unset where there was none) after it. Values reach the code as JSON string literals (valid
/// Python and JavaScript), or single-quoted for Bash; names are checked by
/// [`check_cell_env_name`] first.
pub(crate) fn cell_env(code: EnvCode, env: &BTreeMap<String, String>) -> CellAround {
    // A map of strings: serializing it cannot fail.
    let json = serde_json::to_string(env).unwrap_or_else(|_| "{}".to_owned());
    let literal = serde_json::to_string(&json).unwrap_or_else(|_| "\"{}\"".to_owned());
    match code {
        EnvCode::Python => CellAround {
            before: format!(
                "globals()['__paddock_env'] = (lambda os, new: ({{k: os.environ.get(k) for k in new}}, os.environ.update(new))[0])(__import__('os'), __import__('json').loads({literal}))"
            ),
            after: "(lambda os, old: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v) for k, v in old.items()])(__import__('os'), globals().pop('__paddock_env', {}))".to_owned(),
        },
        EnvCode::Deno => CellAround {
            before: format!(
                "void (globalThis.__paddockEnv = ((n) => {{ const o = {{}}; for (const [k, v] of Object.entries(n)) {{ o[k] = Deno.env.get(k) ?? null; Deno.env.set(k, v); }} return o; }})(JSON.parse({literal})))"
            ),
            after: "void ((o) => { for (const [k, v] of Object.entries(o)) { if (v === null) Deno.env.delete(k); else Deno.env.set(k, v); } delete globalThis.__paddockEnv; })(globalThis.__paddockEnv ?? {})".to_owned(),
        },
        EnvCode::Bash => {
            let mut before = String::new();
            let mut after = String::new();
            for (k, v) in env {
                let quoted = v.replace('\'', "'\\''");
                before.push_str(&format!(
                    "if [ -n \"${{{k}+x}}\" ]; then __paddock_old_{k}=\"${k}\"; __paddock_had_{k}=1; else unset __paddock_had_{k}; fi; export {k}='{quoted}'\n"
                ));
                after.push_str(&format!(
                    "if [ -n \"${{__paddock_had_{k}+x}}\" ]; then export {k}=\"$__paddock_old_{k}\"; else unset {k}; fi; unset __paddock_old_{k} __paddock_had_{k}\n"
                ));
            }
            CellAround { before, after }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_and_aliases() {
        assert_eq!(kernel_for(None).map(|k| k.language), Some("python"));
        assert_eq!(kernel_for(Some(" Python3 ")).map(|k| k.language), Some("python"));
        assert_eq!(kernel_for(Some("sh")).map(|k| k.language), Some("bash"));
        assert_eq!(kernel_for(Some("TS")).map(|k| k.language), Some("javascript"));
        assert_eq!(kernel_for(Some("cobol")), None);
        assert_eq!(known_languages(), "python, javascript, bash");
        for k in KERNELS {
            assert!(k.argv.contains(&"{connection_file}"), "{}", k.language);
        }
    }

    #[test]
    fn the_context_overrides_the_sandbox_which_overrides_the_base() {
        let sandbox = BTreeMap::from([
            ("PATH".to_owned(), "/opt/bin".to_owned()),
            ("A".to_owned(), "1".to_owned()),
        ]);
        let context = BTreeMap::from([
            ("A".to_owned(), "2".to_owned()),
            ("NO_COLOR".to_owned(), "0".to_owned()),
        ]);
        let js = kernel_for(Some("javascript")).expect("javascript");
        let env = kernel_env(js, &sandbox, &context);
        assert_eq!(env["PATH"], "/opt/bin");
        assert_eq!(env["A"], "2");
        assert_eq!(env["LANG"], "C.UTF-8");
        assert_eq!(env["NO_COLOR"], "0");
        assert_eq!(env["DENO_NO_UPDATE_CHECK"], "1");
        assert!(!env.contains_key("PYTHONUNBUFFERED"));
        let py = kernel_env(kernel_for(None).expect("python"), &sandbox, &context);
        assert_eq!(py["PYTHONUNBUFFERED"], "1");
    }

    /// Values a cell may carry, each a trap for one of the quotings.
    fn tricky() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("A".to_owned(), "it's \"quoted\" \\ $HOME `id` $(id)".to_owned()),
            ("B".to_owned(), "line\nbreak\ttab \u{1} é 🦀 \u{2028}".to_owned()),
            ("C_1".to_owned(), String::new()),
        ])
    }

    /// Runs `program` with `script` on stdin and the sandbox-like starting state (`B=old`, `A`
    /// unset); its stdout is the JSON of what it printed.
    fn run(program: &[&str], script: &str) -> String {
        use std::io::Write as _;
        let mut child = std::process::Command::new(program[0])
            .args(&program[1..])
            .env_remove("A")
            .env("B", "old")
            .env_remove("C_1")
            .env("NO_COLOR", "1")
            .env("DENO_NO_UPDATE_CHECK", "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program:?} (scripts/install-deps.sh installs it): {e}"));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("script");
        let out = child.wait_with_output().expect("ran");
        assert!(out.status.success(), "{program:?}: {script}");
        String::from_utf8(out.stdout).expect("utf-8")
    }

    /// Each language sets exactly the cell's values and restores what was there before.
    #[test]
    fn a_cells_variables_are_set_then_restored_in_each_language() {
        let env = tricky();
        let expected_during: Vec<Option<String>> = env.values().cloned().map(Some).collect();
        let expected_after = vec![None, Some("old".to_owned()), None];
        let check = |printed: String, what: &str| {
            let lines: Vec<Vec<Option<String>>> = printed
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {l}: {e}")))
                .collect();
            assert_eq!(lines, [expected_during.clone(), expected_after.clone()], "{what}");
        };

        let py = cell_env(EnvCode::Python, &env);
        let show =
            "print(__import__('json').dumps([__import__('os').environ.get(k) for k in ['A', 'B', 'C_1']]))\n";
        check(
            run(
                &["python3", "-"],
                &format!("{}\n{show}{}\n{show}", py.before, py.after),
            ),
            "python",
        );

        let js = cell_env(EnvCode::Deno, &env);
        let show = "console.log(JSON.stringify(['A', 'B', 'C_1'].map((k) => Deno.env.get(k) ?? null)));\n";
        check(
            run(
                &["deno", "run", "--allow-env", "-"],
                &format!("{};\n{show}{};\n{show}", js.before, js.after),
            ),
            "deno",
        );

        let sh = cell_env(EnvCode::Bash, &env);
        let show = "python3 -c 'import json, os; print(json.dumps([os.environ.get(k) for k in [\"A\", \"B\", \"C_1\"]]))'\n";
        check(
            run(&["bash"], &format!("{}{show}{}{show}", sh.before, sh.after)),
            "bash",
        );
    }

    /// The shipped `code-interpreter` recipe parses, and installs what each kernel of the table
    /// runs (pinned): the recipe and the table cannot drift apart unnoticed.
    #[test]
    fn the_code_interpreter_recipe_installs_every_kernel() {
        let text = include_str!("../../../../templates/code-interpreter/Recipe");
        let recipe = paddock_types::recipe::parse_recipe(text, &BTreeMap::new()).expect("the recipe parses");
        assert_eq!(recipe.from, "python:3.12-slim-bookworm");
        let runs: String = recipe.steps.iter().map(|s| format!("{:?}\n", s)).collect();
        for kernel in KERNELS {
            let package = match kernel.argv {
                ["python3", "-m", "ipykernel_launcher", ..] => "ipykernel==",
                ["python3", "-m", "bash_kernel", ..] => "bash_kernel==",
                ["deno", ..] => "deno==",
                other => panic!("a kernel the recipe does not know how to install: {other:?}"),
            };
            assert!(
                runs.contains(package),
                "{} needs {package}: {runs}",
                kernel.language
            );
        }
        for library in [
            "numpy==",
            "pandas==",
            "matplotlib==",
            "seaborn==",
            "scipy==",
            "scikit-learn==",
            "requests==",
            "openpyxl==",
        ] {
            assert!(runs.contains(library), "{library}");
        }
    }

    #[test]
    fn a_cells_variable_names_are_identifiers() {
        for ok in ["A", "_x", "PATH_2"] {
            assert!(check_cell_env_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "A=B", "é", "A$"] {
            assert!(check_cell_env_name(bad).is_err(), "{bad:?}");
        }
    }
}
