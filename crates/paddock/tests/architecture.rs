//! The architecture's invariants, checked mechanically (see ARCHITECTURE.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Normal (non-dev) dependencies of every workspace crate on other workspace crates and on a few
/// external crates that matter for the layering.
fn dependency_table() -> BTreeMap<String, Vec<String>> {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata json");
    let mut table = BTreeMap::new();
    for pkg in meta["packages"].as_array().expect("packages") {
        let name = pkg["name"].as_str().expect("name").to_owned();
        let deps = pkg["dependencies"]
            .as_array()
            .expect("deps")
            .iter()
            .filter(|d| d["kind"].is_null())
            .map(|d| d["name"].as_str().expect("dep name").to_owned())
            .collect();
        table.insert(name, deps);
    }
    table
}

#[test]
fn crate_dependencies_follow_the_layering() {
    let table = dependency_table();
    let deps = |c: &str| {
        table
            .get(c)
            .unwrap_or_else(|| panic!("crate {c} missing"))
            .clone()
    };
    let forbid = |c: &str, forbidden: &[&str]| {
        for f in forbidden {
            assert!(!deps(c).iter().any(|d| d == f), "{c} must not depend on {f}");
        }
    };
    // Domain data and the wire protocol do no I/O and know nothing of the system.
    forbid(
        "paddock-types",
        &["paddock-sys", "paddock-runtime", "tokio", "libc", "rustix", "nix"],
    );
    forbid(
        "paddock-protocol",
        &["paddock-sys", "paddock-runtime", "tokio", "libc", "rustix", "nix"],
    );
    // Approval policies are data and a pure decision: no I/O, no other paddock crate.
    let policy_deps = deps("paddock-policy");
    assert!(
        policy_deps
            .iter()
            .all(|d| !d.starts_with("paddock") && d != "tokio"),
        "paddock-policy depends only on its pattern and serde crates: {policy_deps:?}"
    );
    // The agent lives next to untrusted workloads: never the host-side runtime (or later control,
    // store, api).
    forbid(
        "paddock-agent",
        &[
            "paddock-runtime",
            "paddock-types",
            "paddock-store",
            "paddock-control",
            "paddock-api",
            "paddock",
        ],
    );
    // SQL lives in the store alone; HTTP serving in the api crate and the binary alone. The egress
    // proxy speaks HTTP/1.1 (hyper) to rewrite the headers of intercepted requests, but serves no API.
    for c in table.keys() {
        if c != "paddock-store" {
            forbid(c, &["rusqlite"]);
        }
        if c != "paddock-api" && c != "paddock-e2b" && c != "paddock" {
            forbid(c, &["axum", "tower-http"]);
            if c != "paddock-egress" && c != "paddock-proxy" {
                forbid(c, &["hyper"]);
            }
        }
    }
    // The egress proxy is a mechanism below the control plane, which will own it.
    forbid(
        "paddock-egress",
        &[
            "paddock-control",
            "paddock-api",
            "paddock-store",
            "paddock-runtime",
            "paddock-agent",
            "paddock",
        ],
    );
    // The store records states; it does not run sandboxes or know the service.
    forbid(
        "paddock-store",
        &["paddock-runtime", "paddock-control", "paddock-api", "tokio"],
    );
    // The port proxy is a mechanism the front-ends share: it knows no service, no sandbox.
    forbid(
        "paddock-proxy",
        &[
            "paddock-control",
            "paddock-runtime",
            "paddock-api",
            "paddock-e2b",
            "axum",
        ],
    );
    // The service is below every front-end.
    forbid("paddock-control", &["paddock-api", "paddock-e2b", "paddock-mcp"]);
    // Front-ends are side by side: each translates onto the service, none onto another.
    forbid("paddock-api", &["paddock-e2b", "paddock-mcp"]);
    forbid(
        "paddock-e2b",
        &[
            "paddock-api",
            "paddock-mcp",
            "paddock-runtime",
            "paddock-store",
            "paddock-sys",
        ],
    );
    forbid(
        "paddock-mcp",
        &[
            "paddock-api",
            "paddock-e2b",
            "paddock-runtime",
            "paddock-store",
            "paddock-sys",
        ],
    );
    // The system-call crate depends on no paddock crate.
    forbid(
        "paddock-sys",
        &[
            "paddock-types",
            "paddock-protocol",
            "paddock-runtime",
            "paddock-agent",
        ],
    );
    // The registry client fetches images into a local layout: among paddock's crates it knows
    // only the domain types, and only the binary and the control plane call it.
    forbid(
        "paddock-registry",
        &[
            "paddock-control",
            "paddock-runtime",
            "paddock-store",
            "paddock-sys",
            "paddock-api",
            "paddock-e2b",
            "paddock-egress",
            "paddock-proxy",
            "paddock-protocol",
            "paddock-agent",
            "paddock",
        ],
    );
    for c in table
        .keys()
        .filter(|c| !["paddock", "paddock-control", "paddock-registry"].contains(&c.as_str()))
    {
        forbid(c, &["paddock-registry"]);
    }
    // The kubernetes-job executor implements the control plane's `Executor` trait: among paddock's
    // crates it knows only paddock-control, and only the binary wires it in.
    let kube_deps = deps("paddock-kube");
    assert!(
        kube_deps
            .iter()
            .filter(|d| d.starts_with("paddock"))
            .all(|d| d == "paddock-control"),
        "paddock-kube depends on no paddock crate but paddock-control: {kube_deps:?}"
    );
    for c in table.keys().filter(|c| c.as_str() != "paddock") {
        forbid(c, &["paddock-kube"]);
    }
    // Only the binary may use anyhow.
    for c in table.keys().filter(|c| c.as_str() != "paddock") {
        forbid(c, &["anyhow"]);
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn only_paddock_sys_contains_unsafe() {
    let crates = workspace_root().join("crates");
    let mut files = Vec::new();
    rust_files(&crates, &mut files);
    // Built at run time so this file does not match its own patterns.
    let word = ["un", "safe"].concat();
    let patterns = [format!("{word} {{"), format!("{word} fn"), format!("{word} impl")];
    let mut offenders = Vec::new();
    for f in files
        .iter()
        .filter(|f| !f.starts_with(crates.join("paddock-sys")))
    {
        let text = std::fs::read_to_string(f).expect("read source");
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if patterns.iter().any(|p| code.contains(p.as_str())) {
                offenders.push(format!("{}:{}", f.display(), i + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "unsafe outside paddock-sys: {offenders:?}");
}

#[test]
fn no_sql_outside_the_store() {
    let crates = workspace_root().join("crates");
    let mut files = Vec::new();
    rust_files(&crates, &mut files);
    // Built at run time so this file does not match its own patterns.
    let patterns = [
        ["SELECT ", "* FROM"].concat(),
        ["INSERT ", "INTO"].concat(),
        ["CREATE ", "TABLE"].concat(),
        ["DELETE ", "FROM"].concat(),
        ["rusqlite", "::"].concat(),
    ];
    let mut offenders = Vec::new();
    for f in files
        .iter()
        .filter(|f| !f.starts_with(crates.join("paddock-store")))
    {
        let text = std::fs::read_to_string(f).expect("read source");
        for (i, line) in text.lines().enumerate() {
            if patterns.iter().any(|p| line.contains(p.as_str())) {
                offenders.push(format!("{}:{}", f.display(), i + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "SQL outside paddock-store: {offenders:?}");
}

/// `PT_INTERP` absent: the agent binary needs no dynamic loader, so it runs in any root file system;
/// nor does the setup shim's (built the same way).
#[test]
fn the_agent_and_the_setup_shim_are_statically_linked() {
    let dir = PathBuf::from(env!("CARGO_BIN_EXE_paddock"));
    for binary in [
        dir.with_file_name("paddock-agent"),
        PathBuf::from(env!("CARGO_BIN_EXE_paddock-setup")),
    ] {
        let elf = std::fs::read(&binary).unwrap_or_else(|e| panic!("read {}: {e}", binary.display()));
        assert_eq!(&elf[..4], b"\x7fELF");
        assert_eq!(elf[4], 2, "64-bit ELF expected");
        let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
        let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().expect("8 bytes")) as usize;
        let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
        let interp = (0..phnum).any(|i| {
            let ph = phoff + i * phentsize;
            u32::from_le_bytes(elf[ph..ph + 4].try_into().expect("4 bytes")) == 3
        });
        assert!(
            !interp,
            "{} has a PT_INTERP header: it is dynamically linked",
            binary.display()
        );
    }
}

/// The setup shim, exec'd at every sandbox creation, stays a small binary: it must not link the
/// server (its HTTP stack, store, clients), whose size and relocations would be paid per creation.
#[test]
fn the_setup_shim_does_not_carry_the_server() {
    let full = file_size(&PathBuf::from(env!("CARGO_BIN_EXE_paddock-full")));
    let setup = file_size(&PathBuf::from(env!("CARGO_BIN_EXE_paddock-setup")));
    assert!(
        setup * 5 < full,
        "paddock-setup is {setup} bytes, more than a fifth of paddock-full's {full}: it links more than the shim"
    );
    let server = server_symbols(&PathBuf::from(env!("CARGO_BIN_EXE_paddock-setup")));
    assert!(
        server.is_empty(),
        "paddock-setup links the server: {:?}",
        &server[..server.len().min(20)]
    );
}

/// The `paddock` front starts every command and supervises every `paddock run` for the command's
/// whole life, so it must not link the server, its clients or the egress proxy (they are
/// `paddock-full`'s): no function of theirs is in its symbol table. The check is on the symbol
/// table because a debug build keeps other traces (line tables) of code the linker dropped.
#[test]
fn the_front_does_not_carry_the_server() {
    let front = PathBuf::from(env!("CARGO_BIN_EXE_paddock"));
    let server = server_symbols(&front);
    assert!(
        server.is_empty(),
        "the paddock front links the server: {:?}",
        &server[..server.len().min(20)]
    );
    // The check itself sees the server where it is.
    let full = server_symbols(&PathBuf::from(env!("CARGO_BIN_EXE_paddock-full")));
    assert!(
        full.len() > 1000,
        "paddock-full shows {} server symbols",
        full.len()
    );
    assert!(file_size(&front) * 2 < file_size(&PathBuf::from(env!("CARGO_BIN_EXE_paddock-full"))));
}

/// `paddock-wait` is what a long `paddock run` becomes while its command runs (`run_lean.rs`): it must
/// not link the async runtime, the command-line parser, the backend or the server, which would bring
/// back the relocated data and heap the hand-over gives up.
#[test]
fn the_waiter_carries_no_runtime_parser_or_backend() {
    const HEAVY: [&str; 6] = [
        "tokio",
        "clap",
        "paddock_runtime",
        "tracing_subscriber",
        "paddock_control",
        "hyper",
    ];
    let waiter = PathBuf::from(env!("CARGO_BIN_EXE_paddock-wait"));
    let heavy = crate_symbols(&waiter, &HEAVY);
    assert!(
        heavy.is_empty(),
        "paddock-wait links {:?}",
        &heavy[..heavy.len().min(20)]
    );
    // The check itself sees them where they are.
    let front = crate_symbols(&PathBuf::from(env!("CARGO_BIN_EXE_paddock")), &HEAVY);
    assert!(front.len() > 1000, "the front shows {} such symbols", front.len());
}

fn file_size(p: &Path) -> u64 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .len()
}

/// The functions and data in an ELF file's symbol table (`.symtab`) that belong to the server's
/// crates, by their mangled crate names.
fn server_symbols(binary: &Path) -> Vec<String> {
    crate_symbols(binary, &SERVER)
}

const SERVER: [&str; 8] = [
    "axum",
    "hyper",
    "rusqlite",
    "rustls",
    "reqwest",
    "paddock_store",
    "paddock_control",
    "paddock_egress",
];

/// The functions and data in an ELF file's symbol table (`.symtab`) whose names hold one of `crates`.
fn crate_symbols(binary: &Path, crates: &[&str]) -> Vec<String> {
    let elf = std::fs::read(binary).unwrap_or_else(|e| panic!("read {}: {e}", binary.display()));
    assert_eq!(&elf[..4], b"\x7fELF");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().expect("4 bytes")) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().expect("8 bytes")) as usize;
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let section = |i: usize| {
        let sh = shoff + i * shentsize;
        // (type, offset, size, link, entry size)
        (
            u32_at(sh + 4),
            u64_at(sh + 0x18),
            u64_at(sh + 0x20),
            u32_at(sh + 0x28),
            u64_at(sh + 0x38),
        )
    };
    let symtab = (0..shnum)
        .map(section)
        .find(|s| s.0 == 2)
        .unwrap_or_else(|| panic!("{} has no symbol table", binary.display()));
    let (_, strings, strings_size, _, _) = section(symtab.3);
    let name_at = |o: usize| {
        let start = strings + o;
        let end = elf[start..strings + strings_size]
            .iter()
            .position(|&b| b == 0)
            .map_or(strings + strings_size, |n| start + n);
        String::from_utf8_lossy(&elf[start..end]).into_owned()
    };
    let mut found = Vec::new();
    for i in 0..symtab.2 / symtab.4 {
        let sym = symtab.1 + i * symtab.4;
        // Defined functions and data only: the table also names every object file linked, whether
        // anything of it was kept or not.
        let (kind, section) = (elf[sym + 4] & 0xf, u16_at(sym + 6));
        if !(kind == 1 || kind == 2) || section == 0 {
            continue;
        }
        let name = name_at(u32_at(sym));
        if crates.iter().any(|c| name.contains(c)) {
            found.push(name);
        }
    }
    found.sort();
    found
}
