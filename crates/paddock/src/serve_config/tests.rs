//! Layering (defaults < file < environment < flags), validation and the TOML round trip.

use std::io::Write;

use super::*;

fn global(config: Option<&Path>) -> GlobalArgs {
    GlobalArgs {
        state_dir: None,
        agent: Some(PathBuf::from("/opt/paddock/paddock-agent")),
        cgroup_parent: None,
        pool_size: None,
        config: config.map(Path::to_path_buf),
    }
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(text.as_bytes()).expect("write");
    f
}

fn load(config: Option<&Path>, env_pairs: &[(&str, &str)], args: &ServeArgs) -> anyhow::Result<ServeConfig> {
    ServeConfig::load(&global(config), None, args, &env(env_pairs))
}

#[test]
fn defaults() {
    let c = load(None, &[], &ServeArgs::default()).expect("loads");
    assert_eq!(c.listen, "127.0.0.1:7420".parse().expect("addr"));
    assert_eq!(c.state_dir, PathBuf::from("/var/lib/paddock"));
    assert_eq!(c.default_limits, Limits::default());
    assert_eq!(c.max_limits.memory, None);
    assert_eq!(c.default_timeout, Duration::from_secs(300));
    assert_eq!(c.max_timeout, Duration::from_secs(86400));
    assert_eq!(c.log, "info");
    assert_eq!(
        c.templates.get("default"),
        Some(&Template {
            rootfs: RootfsSpec::Host,
            warm_pool: 0,
            image: None,
            recipe: None,
            debian: None,
            kernels: Vec::new(),
            build_args: BTreeMap::new(),
            build_network: None,
        })
    );
}

#[test]
fn file_then_env_then_flags() {
    let f = file(
        r#"
        listen = "0.0.0.0:8000"
        state_dir = "/srv/paddock"
        default_timeout = "10m"
        [default_limits]
        memory = "2G"
        pids = 100
        "#,
    );
    let path = Some(f.path());
    let c = load(path, &[], &ServeArgs::default()).expect("file only");
    assert_eq!(c.default_limits.memory, Some(ByteSize::gib(2)));
    assert_eq!(c.default_limits.pids, Some(100));
    assert_eq!(
        c.default_limits.disk,
        Some(ByteSize::gib(10)),
        "unset keys keep their defaults"
    );
    assert_eq!(c.listen.port(), 8000);
    assert_eq!(c.state_dir, PathBuf::from("/srv/paddock"));
    assert_eq!(c.default_timeout, Duration::from_secs(600));

    let vars = [
        ("PADDOCK_DEFAULT_MEMORY", "3G"),
        ("PADDOCK_LISTEN", "127.0.0.1:9000"),
    ];
    let c = load(path, &vars, &ServeArgs::default()).expect("file + env");
    assert_eq!(c.default_limits.memory, Some(ByteSize::gib(3)));
    assert_eq!(c.default_limits.pids, Some(100));
    assert_eq!(c.listen.port(), 9000);

    let args = ServeArgs {
        default_memory: Some(ByteSize::gib(4)),
        ..ServeArgs::default()
    };
    let c = load(path, &vars, &args).expect("file + env + flags");
    assert_eq!(c.default_limits.memory, Some(ByteSize::gib(4)));
    assert_eq!(c.listen.port(), 9000);

    // The global flags (clap has already merged their variables into them) beat the file.
    let mut g = global(path);
    g.state_dir = Some(PathBuf::from("/flag/state"));
    let c = ServeConfig::load(&g, Some("debug"), &ServeArgs::default(), &env(&[])).expect("loads");
    assert_eq!(c.state_dir, PathBuf::from("/flag/state"));
    assert_eq!(c.log, "debug");
}

#[test]
fn unknown_keys_are_named() {
    let f = file("listen = \"127.0.0.1:1\"\nlisten_addr = \"x\"\n");
    let e = load(Some(f.path()), &[], &ServeArgs::default()).expect_err("refused");
    let msg = format!("{e:#}");
    assert!(msg.contains("listen_addr"), "{msg}");
    assert!(msg.contains("line 2"), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");

    let f = file("[default_limits]\nmemroy = \"1G\"\n");
    let msg = format!(
        "{:#}",
        load(Some(f.path()), &[], &ServeArgs::default()).expect_err("refused")
    );
    assert!(msg.contains("memroy"), "{msg}");
    assert!(msg.contains("default_limits"), "{msg}");

    let f = file("[templates.py]\nrootfs = \"relative/dir\"\n");
    let msg = format!(
        "{:#}",
        load(Some(f.path()), &[], &ServeArgs::default()).expect_err("refused")
    );
    assert!(msg.contains("templates.py.rootfs"), "{msg}");

    let f = file("[default_limits]\nmemory = \"lots\"\n");
    let msg = format!(
        "{:#}",
        load(Some(f.path()), &[], &ServeArgs::default()).expect_err("refused")
    );
    assert!(msg.contains("default_limits.memory"), "{msg}");
}

#[test]
fn bad_environment_is_named() {
    let e = load(None, &[("PADDOCK_MAX_CPUS", "many")], &ServeArgs::default()).expect_err("refused");
    assert!(format!("{e:#}").contains("PADDOCK_MAX_CPUS"), "{e:#}");
    let e = load(
        None,
        &[("PADDOCK_DEFAULT_TIMEOUT", "soon")],
        &ServeArgs::default(),
    )
    .expect_err("refused");
    assert!(format!("{e:#}").contains("PADDOCK_DEFAULT_TIMEOUT"), "{e:#}");
    // Empty means unset.
    load(None, &[("PADDOCK_LISTEN", "")], &ServeArgs::default()).expect("empty is unset");
}

#[test]
fn validation() {
    let args = ServeArgs {
        default_memory: Some(ByteSize::gib(8)),
        max_memory: Some(ByteSize::gib(4)),
        ..ServeArgs::default()
    };
    let e = load(None, &[], &args).expect_err("default above max");
    assert!(format!("{e}").contains("max_limits.memory"), "{e}");

    let args = ServeArgs {
        max_cpus: Some("2".parse().expect("cpus")),
        ..ServeArgs::default()
    };
    // No default CPU limit is the host's CPUs: refused once the host (4 CPUs) is known.
    let mut c = load(None, &[], &args).expect("loads");
    let e = c.bound_limits(&host()).expect_err("max without default");
    assert!(format!("{e}").contains("default_limits.cpus"), "{e}");

    let args = ServeArgs {
        default_timeout: Some(Duration::from_secs(7200)),
        max_timeout: Some(Duration::from_secs(3600)),
        ..ServeArgs::default()
    };
    assert!(load(None, &[], &args).is_err());

    let f = file("[templates.\"bad name\"]\n");
    let e = load(Some(f.path()), &[], &ServeArgs::default()).expect_err("bad template name");
    assert!(format!("{e}").contains("templates.bad name"), "{e}");

    let e = ServeConfig::load(&global(None), Some("[[["), &ServeArgs::default(), &env(&[]))
        .expect_err("bad log filter");
    assert!(format!("{e}").starts_with("log:"), "{e}");
}

#[test]
fn templates_and_warm_pool() {
    let f = file(
        r#"
        [templates.default]
        warm_pool = 2
        [templates.debian]
        rootfs = "/srv/rootfs/debian"
        "#,
    );
    let c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    assert_eq!(c.templates["default"].warm_pool, 2);
    assert_eq!(
        c.templates["debian"].rootfs,
        RootfsSpec::Dir {
            path: PathBuf::from("/srv/rootfs/debian")
        }
    );
    let c = load(
        Some(f.path()),
        &[("PADDOCK_WARM_POOL", "5")],
        &ServeArgs::default(),
    )
    .expect("loads");
    assert_eq!(c.templates["default"].warm_pool, 5);
    let args = ServeArgs {
        warm_pool: Some(7),
        ..ServeArgs::default()
    };
    let c = load(Some(f.path()), &[("PADDOCK_WARM_POOL", "5")], &args).expect("loads");
    assert_eq!(c.templates["default"].warm_pool, 7);
    assert_eq!(c.templates["default"].rootfs, RootfsSpec::Host);
    let service = c.service_config().expect("service config");
    assert_eq!(service.templates["debian"].warm_pool_size, 0);
}

#[test]
fn shown_toml_loads_back_to_the_same_configuration() {
    let f = file(
        r#"
        history_retention = "2days"
        max_import = "3G"
        [default_limits]
        cpus = 1.5
        [max_limits]
        cpus = 4
        disk = "20G"
        [templates.debian]
        rootfs = "/srv/rootfs/debian"
        warm_pool = 1
        "#,
    );
    // As `paddock config show` prints it: bounded by the host.
    let mut c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    c.bound_limits(&host()).expect("fits the host");
    let shown = c.to_toml().expect("renders");
    assert!(shown.contains("disk = \"20G\""), "{shown}");
    assert!(shown.contains("pids = 8192"), "derived maxima are shown: {shown}");
    assert!(
        shown.contains("max_snapshots = 1000"),
        "quotas are shown: {shown}"
    );
    assert!(shown.contains("max_storage = \"unlimited\""), "{shown}");
    assert!(shown.contains("max_timeout = \"1day\""), "{shown}");
    assert!(shown.contains("max_import = \"3G\""), "{shown}");
    assert_eq!(
        c.service_config().expect("service config").max_import_bytes,
        3 << 30
    );
    let again = file(&shown);
    let mut c2 = load(Some(again.path()), &[], &ServeArgs::default()).expect("reloads");
    c2.bound_limits(&host()).expect("fits the host");
    assert_eq!(c, c2, "{shown}");
}

#[test]
fn the_default_configuration_shown_loads_back() {
    // The maxima derived from the host are shown; CPUs among them with no default CPU limit.
    let mut c = load(None, &[], &ServeArgs::default()).expect("loads");
    c.bound_limits(&host()).expect("fits the host");
    let shown = c.to_toml().expect("renders");
    let again = file(&shown);
    let mut c2 = load(Some(again.path()), &[], &ServeArgs::default()).expect("reloads");
    c2.bound_limits(&host()).expect("fits the host");
    assert_eq!(c, c2, "{shown}");
}

#[test]
fn a_cpu_maximum_below_the_host_needs_a_default_cpu_limit() {
    // No CPU limit is the host's 4 CPUs: above a maximum of 2, refused once the host is known.
    let f = file("[max_limits]\ncpus = 2\n");
    let mut c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    let e = c.bound_limits(&host()).expect_err("4 CPUs > 2");
    assert!(e.to_string().contains("default_limits.cpus"), "{e}");
    let f = file("[max_limits]\ncpus = 2\n[default_limits]\ncpus = 1\n");
    let mut c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    c.bound_limits(&host()).expect("1 CPU by default, at most 2");
}

/// A host with 16 GiB, 4 CPUs, pid_max 32768 and a 20 GiB pool.
fn host() -> HostFacts {
    HostFacts {
        memory_bytes: 16 << 30,
        cpus: 4,
        pid_max: 32_768,
        threads_max: 100_000,
        pool_bytes: 20 << 30,
    }
}

#[test]
fn unset_maxima_are_derived_from_the_host() {
    let mut c = load(None, &[], &ServeArgs::default()).expect("loads");
    assert_eq!(c.max_limits, Limits::unbounded(), "nothing configured");
    c.bound_limits(&host()).expect("fits");
    assert_eq!(
        c.max_limits.memory,
        Some(ByteSize::gib(12)),
        "3/4 of the host's memory"
    );
    assert_eq!(c.max_limits.cpus, CpuQuota::try_from(4.0).ok());
    assert_eq!(c.max_limits.pids, Some(8192), "a quarter of pid_max");
    assert_eq!(c.max_limits.disk, Some(ByteSize::gib(20)), "the pool");
    assert_eq!(
        c.default_limits,
        Limits::default(),
        "the built-in defaults fit this host"
    );
    // No CPU limit by default: within a maximum of all the host's CPUs.
    assert_eq!(c.default_limits.cpus, None);
    assert_eq!(
        c.service_config().expect("service config").max_limits,
        c.max_limits
    );
}

#[test]
fn configured_maxima_are_kept_and_built_in_defaults_shrink_to_a_small_host() {
    let f = file(
        r#"
        [max_limits]
        pids = 2000
        "#,
    );
    let small = HostFacts {
        memory_bytes: 1 << 30,
        pool_bytes: 4 << 30,
        ..host()
    };
    let mut c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    c.bound_limits(&small).expect("fits");
    assert_eq!(c.max_limits.pids, Some(2000), "configured");
    assert_eq!(c.max_limits.memory, Some(ByteSize::mib(768)));
    assert_eq!(
        c.default_limits.memory,
        Some(ByteSize::mib(768)),
        "1G lowered to fit"
    );
    assert_eq!(
        c.default_limits.disk,
        Some(ByteSize::gib(4)),
        "10G lowered to the pool"
    );
    assert_eq!(c.default_limits.pids, Some(1024), "fits: kept");
}

#[test]
fn a_configured_default_above_the_hosts_maximum_is_refused() {
    let f = file(
        r#"
        [default_limits]
        disk = "30G"
        "#,
    );
    let mut c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    let e = c.bound_limits(&host()).expect_err("30G default in a 20G pool");
    let msg = e.to_string();
    assert!(
        msg.contains("default_limits.disk") && msg.contains("derived from this host"),
        "{msg}"
    );
    let f = file(
        r#"
        [max_limits]
        pids = 10000000
        [default_limits]
        pids = 100
        "#,
    );
    let mut c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    let e = c.bound_limits(&host()).expect_err("above the kernel's pid limit");
    assert!(e.to_string().contains("max_limits.pids"), "{e}");
}

#[test]
fn quotas_have_defaults_and_can_be_set_or_lifted() {
    let c = load(None, &[], &ServeArgs::default()).expect("loads");
    assert_eq!(c.quotas, DEFAULT_QUOTAS);
    assert_eq!(c.service_config().expect("service config").quotas, DEFAULT_QUOTAS);
    let f = file(
        r#"
        [quotas]
        max_sandboxes = "unlimited"
        max_storage = "500G"
        max_cpus = 8
        "#,
    );
    let c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    assert_eq!(c.quotas.max_sandboxes, None, "lifted");
    assert_eq!(c.quotas.max_storage_bytes, Some(500 << 30));
    assert_eq!(c.quotas.max_cpu_millis, Some(8000));
    assert_eq!(c.quotas.max_snapshots, Some(1000), "unset keys keep the default");
    let f = file(
        r#"
        [quotas]
        max_snapshots = "lots"
        "#,
    );
    let e = load(Some(f.path()), &[], &ServeArgs::default()).expect_err("not a number");
    assert!(e.to_string().contains("quotas.max_snapshots"), "{e}");
}

#[test]
fn egress_limits_load_validate_and_round_trip() {
    let c = load(None, &[], &ServeArgs::default()).expect("defaults");
    assert_eq!(c.egress.limits.egress(), paddock_egress::EgressLimits::default());
    assert_eq!(
        c.egress.limits.conntrack(),
        paddock_types::ConntrackLimits::default()
    );
    let f = file(
        r#"
        [egress.limits]
        proxy_connections = 32
        dns_tcp_connections = 4
        descriptors = 1000
        idle_timeout = "90s"
        dns_tcp_lifetime = "10s"
        conntrack_max = 512
        new_connections_per_second = 50
        "#,
    );
    // As `paddock config show` prints it: bounded by the host.
    let mut c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    c.bound_limits(&host()).expect("fits the host");
    let e = c.egress.limits.egress();
    assert_eq!(
        (
            e.proxy_connections,
            e.transparent_connections,
            e.dns_tcp_connections,
            e.descriptors
        ),
        (32, 256, 4, Some(1000))
    );
    assert_eq!(
        (e.idle_timeout, e.dns_tcp_lifetime),
        (Duration::from_secs(90), Duration::from_secs(10))
    );
    let ct = c.egress.limits.conntrack();
    assert_eq!((ct.max_connections, ct.new_per_second), (512, 50));
    let shown = c.to_toml().expect("renders");
    assert!(
        shown.contains("[egress.limits]") && shown.contains("conntrack_max = 512"),
        "{shown}"
    );
    let again = file(&shown);
    let mut c2 = load(Some(again.path()), &[], &ServeArgs::default()).expect("reloads");
    c2.bound_limits(&host()).expect("fits the host");
    assert_eq!(c2, c);

    for (text, key) in [
        (
            "[egress.limits]\nproxy_connections = 0\n",
            "egress.limits.proxy_connections",
        ),
        (
            "[egress.limits]\nconntrack_max = 0\n",
            "egress.limits.conntrack_max",
        ),
        ("[egress.limits]\ndescriptors = 1\n", "egress.limits.descriptors"),
        ("[egress.limits]\nsockets = 5\n", "sockets"),
    ] {
        let f = file(text);
        let e = load(Some(f.path()), &[], &ServeArgs::default()).expect_err(text);
        assert!(format!("{e:#}").contains(key), "{text}: {e:#}");
    }
}

#[test]
fn e2b_and_ports_sections_load_validate_and_round_trip() {
    let f =
        file("[e2b]\ndomain = \"sandbox.example.com\"\n[ports]\nper_sandbox = 8\nconnect_timeout = \"2s\"\n");
    let c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    assert!(c.e2b.enabled);
    assert_eq!(c.e2b.domain.as_deref(), Some("sandbox.example.com"));
    let ports = c.service_config().expect("service config").ports;
    assert_eq!((ports.per_sandbox, ports.per_tenant), (8, 1024));
    assert_eq!(ports.connect_timeout, Duration::from_secs(2));
    let shown = file(&c.to_toml().expect("toml"));
    let again = load(Some(shown.path()), &[], &ServeArgs::default()).expect("loads back");
    assert_eq!((again.e2b, again.ports), (c.e2b, c.ports));
    for (text, named) in [
        ("[e2b]\ndomain = \"bad domain\"\n", "e2b.domain"),
        ("[ports]\nper_tenant = 0\n", "ports.per_tenant"),
        ("[ports]\nconnect_timeout = \"10ms\"\n", "ports.connect_timeout"),
    ] {
        let f = file(text);
        let e = load(Some(f.path()), &[], &ServeArgs::default()).expect_err("refused");
        assert!(format!("{e:#}").contains(named), "{text}: {e:#}");
    }
}

#[test]
fn built_templates_load_validate_and_read_their_recipe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recipe = dir.path().join("Recipe");
    std::fs::write(&recipe, "FROM python:3.12-slim\nRUN pip install pandas\n").expect("recipe");
    let f = file(&format!(
        "[templates.py]\nimage = \"python:3.12-slim\"\nwarm_pool = 3\n[templates.data]\nrecipe = {:?}\n\
         build_args = {{ BASE = \"python:3.11-slim\" }}\n\
         build_network = {{ allow = [{{ domain = \"pypi.org\" }}] }}\n\
         [templates.base]\ndebian = {{ suite = \"bookworm\", packages = [\"python3\"] }}\n",
        recipe.display().to_string()
    ));
    let c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    assert_eq!(c.templates["py"].image.as_deref(), Some("python:3.12-slim"));
    assert_eq!(c.templates["py"].warm_pool, 3);
    let service = c.service_config().expect("service config");
    assert!(service.templates["py"].is_built());
    assert_eq!(
        service.templates["data"].recipe.as_deref(),
        Some("FROM python:3.12-slim\nRUN pip install pandas\n"),
        "the recipe's text is read at startup"
    );
    // Its build arguments and its steps' network reach the build, and are part of its source.
    let build = &service.templates["data"].build;
    assert_eq!(build.args["BASE"], "python:3.11-slim");
    let network = serde_json::to_value(build.network.as_ref().expect("a network")).expect("json");
    assert_eq!(network["allow"][0]["domain"], "pypi.org", "{network}");
    assert!(build.source_suffix().starts_with(", build sha256:"));
    assert_eq!(service.templates["py"].build.source_suffix(), "");
    assert!(!service.templates["default"].is_built());
    let base = service.templates["base"].debian.as_ref().expect("a Debian base");
    assert_eq!(base.source(), "debian: bookworm (minbase) + python3");
    assert!(service.templates["base"].is_built());
    // Shown and loaded back: the same.
    let shown = c.to_toml().expect("toml");
    let again = file(&shown);
    let back = load(Some(again.path()), &[], &ServeArgs::default()).expect("loads back");
    assert_eq!(back.templates, c.templates);
    for (text, key) in [
        ("[templates.x]\nimage = \"a\"\nrootfs = \"host\"\n", "templates.x"),
        ("[templates.x]\nimage = \"Not A Ref\"\n", "templates.x.image"),
        (
            "[templates.x]\nrecipe = \"relative/Recipe\"\n",
            "templates.x.recipe",
        ),
        (
            "[templates.x]\nimage = \"a\"\nbuild_args = { A = \"1\" }\n",
            "templates.x",
        ),
        (
            "[templates.x]\ndebian = { suite = \"bookworm\", variant = \"huge\" }\n",
            "templates.x.debian",
        ),
        (
            "[templates.x]\ndebian = { suite = \"--hook-dir=/x\" }\n",
            "templates.x.debian",
        ),
        (
            "[templates.x]\ndebian = { suite = \"bookworm\", packages = [\"a b\"] }\n",
            "templates.x.debian",
        ),
        (
            "[templates.x]\ndebian = { suite = \"bookworm\" }\nimage = \"a\"\n",
            "templates.x",
        ),
    ] {
        let f = file(text);
        let e = load(Some(f.path()), &[], &ServeArgs::default()).expect_err(text);
        assert!(format!("{e:#}").contains(key), "{text}: {e:#}");
    }
    // A recipe that is not one is refused at startup, naming the key and the line.
    std::fs::write(&recipe, "FROM python\nHEALTHCHECK NONE\n").expect("recipe");
    let f = file(&format!(
        "[templates.data]\nrecipe = {:?}\n",
        recipe.display().to_string()
    ));
    let c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads (read at startup)");
    let e = c.service_config().expect_err("a bad recipe");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("templates.data.recipe") && msg.contains("line 2"),
        "{msg}"
    );
}

#[test]
fn the_mcp_section_loads_validates_and_round_trips() {
    let f = file(
        "[mcp]\npublic_url = \"https://paddock.example\"\nallowed_hosts = [\"paddock.example\"]\n\
         allowed_origins = [\"https://console.example\"]\nmax_sessions = 8\n",
    );
    let c = load(Some(f.path()), &[], &ServeArgs::default()).expect("loads");
    assert!(c.mcp.enabled);
    assert_eq!(c.mcp.public_url.as_deref(), Some("https://paddock.example"));
    assert_eq!(c.mcp.allowed_hosts, ["paddock.example"]);
    assert_eq!(c.mcp.max_sessions, 8);
    let shown = file(&c.to_toml().expect("toml"));
    let again = load(Some(shown.path()), &[], &ServeArgs::default()).expect("loads back");
    assert_eq!(again.mcp, c.mcp);
    let defaults = load(None, &[], &ServeArgs::default()).expect("loads");
    assert_eq!(defaults.mcp, McpEndpointSettings::default());
    for (text, named) in [
        ("[mcp]\npublic_url = \"ftp://x\"\n", "mcp.public_url"),
        ("[mcp]\nallowed_hosts = [\"https://x/\"]\n", "mcp.allowed_hosts"),
        (
            "[mcp]\nallowed_origins = [\"https://x/path\"]\n",
            "mcp.allowed_origins",
        ),
        ("[mcp]\nmax_sessions = 0\n", "mcp.max_sessions"),
        ("[mcp]\nsessions = 3\n", "sessions"),
    ] {
        let f = file(text);
        let e = load(Some(f.path()), &[], &ServeArgs::default()).expect_err("refused");
        assert!(format!("{e:#}").contains(named), "{text}: {e:#}");
    }
}
