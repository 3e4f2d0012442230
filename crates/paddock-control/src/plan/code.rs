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
    },
    KernelSpec {
        language: "bash",
        aliases: &["sh", "shell"],
        argv: &["python3", "-m", "bash_kernel", "-f", "{connection_file}"],
        setup: None,
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
/// they are given), then the sandbox's variables, then the context's.
pub(crate) fn kernel_env(
    sandbox: &BTreeMap<String, String>,
    context: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        (
            "PATH".to_owned(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        ),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("PYTHONUNBUFFERED".to_owned(), "1".to_owned()),
    ]);
    env.extend(sandbox.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.extend(context.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_and_aliases() {
        assert_eq!(kernel_for(None).map(|k| k.language), Some("python"));
        assert_eq!(kernel_for(Some(" Python3 ")).map(|k| k.language), Some("python"));
        assert_eq!(kernel_for(Some("sh")).map(|k| k.language), Some("bash"));
        assert_eq!(kernel_for(Some("cobol")), None);
        assert_eq!(known_languages(), "python, bash");
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
        let context = BTreeMap::from([("A".to_owned(), "2".to_owned())]);
        let env = kernel_env(&sandbox, &context);
        assert_eq!(env["PATH"], "/opt/bin");
        assert_eq!(env["A"], "2");
        assert_eq!(env["LANG"], "C.UTF-8");
    }
}
