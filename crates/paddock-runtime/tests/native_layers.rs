//! The native backend's modules import each other without circles: a module that needs another's
//! step is above it, never beside it both ways (so `lifecycle` is read before `adopt` and
//! `rollback`, which build on it). A source check over `super::` and `crate::native::` paths.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The native backend's files (its `mod.rs`, which declares them, aside), by module name: a
/// directory module's files count as that module.
fn modules() -> BTreeMap<String, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/native");
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(&root).expect("read native/") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().expect("a name").to_string_lossy().into_owned();
        if name == "mod" {
            continue;
        }
        let text = if path.is_dir() {
            let mut all = String::new();
            collect(&path, &mut all);
            all
        } else {
            std::fs::read_to_string(&path).expect("read a module")
        };
        out.entry(name).or_default().push_str(&text);
    }
    out
}

fn collect(dir: &Path, out: &mut String) {
    for entry in std::fs::read_dir(dir).expect("read a module directory") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).expect("read a file"));
        }
    }
}

/// The sibling modules `text` names (`super::x` from a file directly under `native/`,
/// `crate::native::x` from anywhere), comments aside.
fn named(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for prefix in ["super::", "crate::native::"] {
            for (i, _) in code.match_indices(prefix) {
                let rest = &code[i + prefix.len()..];
                let items: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                    group
                        .split([',', '}'])
                        .map(|s| s.trim().split("::").next().unwrap_or("").to_owned())
                        .collect()
                } else {
                    vec![rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect()]
                };
                out.extend(items.into_iter().filter(|m| modules.contains(m)));
            }
        }
    }
    out
}

#[test]
fn native_modules_import_each_other_without_circles() {
    let modules = modules();
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    assert!(
        ["adopt", "lifecycle", "rollback", "sandbox"]
            .iter()
            .all(|m| names.contains(*m)),
        "the modules this test is about exist: {names:?}"
    );
    let graph: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|(m, text)| {
            let mut deps = named(text, &names);
            deps.remove(m);
            (m.clone(), deps)
        })
        .collect();
    // Kahn's algorithm: what cannot be ordered lies on a circle.
    let mut indegree: BTreeMap<&str, usize> = graph.keys().map(|m| (m.as_str(), 0)).collect();
    for deps in graph.values() {
        for d in deps {
            *indegree.get_mut(d.as_str()).expect("a module") += 1;
        }
    }
    let mut ready: Vec<&str> = indegree
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(m, _)| *m)
        .collect();
    let mut ordered = 0;
    while let Some(m) = ready.pop() {
        ordered += 1;
        for d in &graph[m] {
            let n = indegree.get_mut(d.as_str()).expect("a module");
            *n -= 1;
            if *n == 0 {
                ready.push(d.as_str());
            }
        }
    }
    let circled: Vec<&str> = indegree
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(m, _)| *m)
        .collect();
    assert_eq!(
        ordered,
        graph.len(),
        "modules on an import circle: {circled:?}; graph: {graph:#?}"
    );
}

#[test]
fn the_check_sees_imports() {
    let names: BTreeSet<String> = ["a", "b", "c"].into_iter().map(String::from).collect();
    let found = named(
        "use super::a::X;\nuse super::{b, c::Y};\n// use super::c;",
        &names,
    );
    assert_eq!(found, names);
    let found = named("fn f() { crate::native::b::g() } // super::c", &names);
    assert_eq!(found, ["b".to_owned()].into_iter().collect());
}
