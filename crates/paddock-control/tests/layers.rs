//! The control plane's floors, checked over its sources: a module imports only from its own floor or
//! the floors below (`core` < `plan` < `lifecycle` < `ops`), no two files import each other in a
//! circle, and an operation neither imports nor calls another operation's file (every shared step
//! lives in a floor below). See ARCHITECTURE.md, "The control plane's floors".
//!
//! A source check, not a compiler one: `use crate::...` lines and `crate::...` paths give the
//! imports, `self.name(` calls of methods defined in exactly one file give the calls.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const FLOORS: [&str; 4] = ["core", "plan", "lifecycle", "ops"];

/// Every `.rs` file under `src/`, by its path relative to `src/`.
fn sources() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .expect("under src")
                    .to_string_lossy()
                    .into_owned();
                out.insert(rel, std::fs::read_to_string(&path).expect("read source"));
            }
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The floor of a file (`None` for `lib.rs`, which only declares and re-exports).
fn floor(file: &str) -> Option<usize> {
    let top = file.split('/').next()?;
    FLOORS.iter().position(|f| *f == top)
}

/// The module a file is (`ops/exec.rs` → `ops::exec`; `ops/exec/mod.rs` → `ops::exec`).
fn module_of(file: &str) -> String {
    let trimmed = file.trim_end_matches(".rs").trim_end_matches("/mod");
    trimmed.replace('/', "::")
}

/// The file-level unit a module path belongs to: its first two segments (`ops::exec::tests` →
/// `ops::exec`), the unit of the rules.
fn unit(module: &str) -> String {
    module.split("::").take(2).collect::<Vec<_>>().join("::")
}

/// Code without comments (so docs naming other modules do not count as imports).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The units a file's code names through `crate::` paths (grouped imports expanded), and through
/// the crate root's re-exports (`crate::SandboxService` is `core::service`'s).
fn imports(text: &str) -> BTreeSet<String> {
    let reexports = root_reexports();
    let text = code(text);
    let mut out = BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let tree = path_tree(rest);
        for leaf in leaves(&tree) {
            let segs: Vec<&str> = leaf.split("::").map(str::trim).collect();
            match segs.as_slice() {
                [first, second, ..] if FLOORS.contains(first) => {
                    out.insert(format!("{first}::{second}"));
                }
                [name, ..] => {
                    if let Some(unit) = reexports.get(*name) {
                        out.insert(unit.clone());
                    }
                }
                [] => {}
            }
        }
        rest = &rest[tree.len()..];
    }
    out
}

/// The path (with its `{...}` groups) at the start of `s`.
fn path_tree(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.char_indices() {
        if c == '{' {
            let end = i + matching_brace(&s[i..]);
            out.push_str(&s[i..=end.min(s.len() - 1)]);
            break;
        }
        if c.is_alphanumeric() || c == '_' || c == ':' {
            out.push(c);
        } else {
            break;
        }
    }
    out
}

/// `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn leaves(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.to_owned()];
    };
    let prefix = &tree[..open];
    let end = open + matching_brace(&tree[open..]);
    split_top(&tree[open + 1..end])
        .into_iter()
        .filter(|part| !part.trim().is_empty())
        .flat_map(leaves)
        .map(|leaf| format!("{prefix}{leaf}"))
        .collect()
}

/// What `lib.rs` re-exports at the crate root, by name: the unit it comes from.
fn root_reexports() -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("read lib.rs");
    let mut out = BTreeMap::new();
    for line in code(&lib).split(';') {
        let Some(path) = line.trim().strip_prefix("pub use crate::") else {
            continue;
        };
        for leaf in leaves(&path_tree(path)) {
            let segs: Vec<&str> = leaf.split("::").map(str::trim).collect();
            if let ([first, second, ..], Some(name)) = (segs.as_slice(), segs.last()) {
                out.insert((*name).to_owned(), format!("{first}::{second}"));
            }
        }
    }
    out
}

/// Index of the `}` closing the `{` at the start of `s`.
fn matching_brace(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// Splits at commas outside braces.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[test]
fn every_module_belongs_to_a_floor() {
    for file in sources().keys() {
        assert!(
            file == "lib.rs" || floor(file).is_some(),
            "{file} is in no floor: put it under one of {FLOORS:?}"
        );
    }
}

#[test]
fn modules_import_only_from_their_floor_or_below() {
    let mut broken = Vec::new();
    for (file, text) in sources() {
        let Some(own) = floor(&file) else { continue };
        for import in imports(&text) {
            let target = floor(&format!("{}.rs", import.replace("::", "/"))).expect("a floor");
            if target > own {
                broken.push(format!("{file} imports {import} from a floor above"));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn no_operation_imports_another() {
    let mut broken = Vec::new();
    for (file, text) in sources() {
        if floor(&file) != Some(3) {
            continue;
        }
        let own = unit(&module_of(&file));
        for import in imports(&text) {
            if import.starts_with("ops::") && import != own {
                broken.push(format!("{file} imports {import}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "operations use the floors below, never each other: {broken:#?}"
    );
}

#[test]
fn no_import_circle_between_files() {
    let sources = sources();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in &sources {
        if floor(file).is_none() {
            continue;
        }
        let own = unit(&module_of(file));
        let targets = graph.entry(own.clone()).or_default();
        for import in imports(text) {
            if import != own {
                targets.insert(import);
            }
        }
    }
    // Depth-first search for a back edge.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_owned(), 1);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|n| n == next).expect("on the stack");
                    let mut circle = stack[at..].to_vec();
                    circle.push(next.clone());
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if state.get(node.as_str()).copied().unwrap_or(0) == 0 {
            let circle = visit(node, &graph, &mut state, &mut Vec::new());
            assert!(
                circle.is_none(),
                "files import each other in a circle: {circle:?}"
            );
        }
    }
}

#[test]
fn no_operation_calls_a_method_of_another() {
    let sources = sources();
    // Methods defined in exactly one unit.
    let mut defined: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in &sources {
        let text = code(text);
        for (i, _) in text.match_indices("fn ") {
            let before = text[..i].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = text[i + 3..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            defined.entry(name).or_default().insert(unit(&module_of(file)));
        }
    }
    let mut broken = Vec::new();
    for (file, text) in &sources {
        if floor(file) != Some(3) {
            continue;
        }
        let own = unit(&module_of(file));
        let text = code(text);
        for (i, _) in text.match_indices("self.") {
            let name: String = text[i + 5..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !text[i + 5 + name.len()..].starts_with('(') {
                continue;
            }
            if let Some(units) = defined.get(&name) {
                if units.len() == 1 && !units.contains(&own) {
                    let other = units.iter().next().expect("one");
                    if other.starts_with("ops::") {
                        broken.push(format!("{file} calls {name} of {other}"));
                    }
                }
            }
        }
    }
    broken.sort();
    broken.dedup();
    assert!(
        broken.is_empty(),
        "operations use the floors below, never each other: {broken:#?}"
    );
}

#[test]
fn the_checks_see_imports() {
    // The parser finds what it must, so the rules above cannot pass by seeing nothing.
    let found = imports(
        "use crate::core::service::{lock, now_ms};\nuse crate::{core::live::LiveSandbox, ops::{exec, files::x}};\nfn f() { crate::plan::create::DEFAULT; }\n// use crate::ops::admin;",
    );
    let expected: BTreeSet<String> = [
        "core::service",
        "core::live",
        "ops::exec",
        "ops::files",
        "plan::create",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, expected);
    assert!(sources().len() > 20, "the sources were found");
}
