//! The command line with sandbox networks: `paddock run` filters and injects like the server, and the
//! CLI manages secrets and sandbox networks on a real `paddock serve`.

use super::*;

/// A configuration file whose `[egress]` section maps the test names to the outside world (in the
/// outside world's directory, removed with it, also when a test fails).
fn egress_toml(o: &Outside) -> std::path::PathBuf {
    let config = o._dir.path().join("serve.toml");
    let ca = o._dir.path().join("ca.pem");
    std::fs::write(
        &config,
        format!(
            "[egress]\nsystem_resolver = false\nupstream_ca_files = [{ca:?}]\n[egress.hosts]\n\"allowed.test\" = [\"{ip}\"]\n\"other.test\" = [\"{ip}\"]\n\"secret.test\" = [\"{ip}\"]\n[[egress.allow]]\ncidr = \"{ip}/32\"\nreason = \"the test's outside world\"\n",
            ip = o.ip
        ),
    )
    .expect("config");
    config
}

/// `paddock run` serves its sandbox's network in its own process, with the operator settings of the
/// configuration file and the secret's value from its own environment.
#[test]
fn paddock_run_filters_and_injects_like_the_server() {
    let o = outside();
    let env = TestEnv::new();
    let config = egress_toml(&o);
    let script = [
        fetch(&format!("http://allowed.test:{}/hello.txt", o.http), None),
        fetch(&format!("http://other.test:{}/hello.txt", o.http), None),
        "echo \"placeholder=$GH\"\n".to_owned(),
        fetch(
            &format!("https://secret.test:{}/echo", o.https),
            Some("'Bearer ' + os.environ['GH']"),
        ),
    ]
    .concat();
    let out = env
        .cmd()
        .env("GH", SECRET_VALUE)
        .arg("--config")
        .arg(&config)
        .args([
            "run",
            "--allow-domain",
            "allowed.test",
            "--allow-domain",
            "secret.test",
            "--secret",
            "GH:secret.test",
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .expect("paddock run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].contains("GOT hello from outside"), "{stdout}");
    assert!(
        lines.iter().any(|l| l.starts_with("ERR")),
        "other.test was reached: {stdout}"
    );
    assert!(stdout.contains("placeholder=paddock-secret:GH"), "{stdout}");
    assert!(
        stdout.contains(&format!("auth=Bearer {SECRET_VALUE}")),
        "{stdout}"
    );
    // The refusal is reported on stderr (paddock run keeps no audit log).
    assert!(stderr.contains("refused"), "{stderr}");
    // Without an [egress] section the defaults apply: the operator's deny list has no exception for
    // the test's address, so nothing gets through, and a bad flag is one line and a failure.
    let out = env
        .cmd()
        .args(["run", "--allow-cidr", "10.0.0.1/8", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .expect("paddock run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("host bits"), "{stderr}");
    env.assert_clean();
}

/// The CLI against a real `paddock serve` configured from a file: secrets, a networked sandbox, its
/// network view and a live change.
#[test]
fn the_cli_manages_secrets_and_sandbox_networks_on_a_server() {
    let o = outside();
    let env = TestEnv::new();
    let config = egress_toml(&o);
    let serve_args = ["--config", config.to_str().expect("utf-8")];
    let server = Server::start(&env, &serve_args, "info");
    let url = std::cell::RefCell::new(server.url.clone());
    let cli = |args: &[&str]| {
        env.cmd()
            .env("PADDOCK_URL", url.borrow().as_str())
            .env("GH", SECRET_VALUE)
            .stdin(Stdio::null())
            .args(args)
            .output()
            .expect("paddock runs")
    };
    let ok = |args: &[&str]| {
        let out = cli(args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!text.contains(SECRET_VALUE), "{args:?} printed the secret");
        text
    };
    let fails = |args: &[&str], needle: &str| {
        let out = cli(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    };
    assert_eq!(
        ok(&[
            "secret",
            "create",
            "GH",
            "--host",
            "secret.test",
            "--from-env",
            "GH"
        ])
        .trim(),
        "GH"
    );
    fails(
        &[
            "secret",
            "create",
            "GH",
            "--host",
            "secret.test",
            "--from-env",
            "GH",
        ],
        "exists",
    );
    let listed = ok(&["secret", "ls"]);
    assert!(
        listed.contains("GH") && listed.contains("secret.test"),
        "{listed}"
    );
    fails(&["sandbox", "create", "--secret", "NOPE"], "NOPE");
    let id = ok(&[
        "sandbox",
        "create",
        "--allow-domain",
        "allowed.test",
        "--allow-domain",
        "secret.test",
        "--secret",
        "GH",
    ])
    .trim()
    .to_owned();
    let fetch_allowed = fetch(&format!("http://allowed.test:{}/hello.txt", o.http), None);
    let out = ok(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_allowed]);
    assert!(out.contains("GOT hello from outside"), "{out}");
    // What the bound host received from the sandbox. (The server echoes the header, so this output
    // does hold the value: it is read directly, not through `ok`.)
    let fetch_secret = fetch(
        &format!("https://secret.test:{}/echo", o.https),
        Some("'Bearer ' + os.environ['GH']"),
    );
    let echo_of_secret = || {
        let out = cli(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_secret]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = echo_of_secret();
    assert!(
        out.contains(&format!("auth=Bearer {SECRET_VALUE}")),
        "{out}\n{}",
        ok(&["sandbox", "network", &id])
    );
    // The audit rows arrive a moment after the connection ends.
    let mut shown = String::new();
    for _ in 0..50 {
        shown = ok(&["sandbox", "network", &id]);
        if shown.contains("allowed.test (") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(shown.contains("allow:   allowed.test secret.test"), "{shown}");
    assert!(shown.contains("secrets: GH"), "{shown}");
    assert!(
        shown.contains("allowed.test (") && shown.contains("allowed"),
        "{shown}"
    );
    fails(
        &["sandbox", "network", &id, "--allow-domain", "other.test"],
        "--set",
    );
    let shown = ok(&[
        "sandbox",
        "network",
        &id,
        "--set",
        "--allow-domain",
        "other.test",
        "--allow-domain",
        "secret.test",
    ]);
    assert!(shown.contains("allow:   other.test secret.test"), "{shown}");
    let out = ok(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_allowed]);
    assert!(out.starts_with("ERR"), "after the change: {out}");
    // A restarted server serves the adopted sandbox again: the changed policy, the same CA (the
    // sandbox's trust store still holds it) and the secret.
    server.stop();
    let server = Server::restart(&env, &serve_args, "info");
    *url.borrow_mut() = server.url.clone();
    let fetch_other = fetch(&format!("http://other.test:{}/hello.txt", o.http), None);
    let out = ok(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_other]);
    assert!(out.contains("GOT hello from outside"), "after a restart: {out}");
    let out = ok(&["sandbox", "exec", &id, "--", "sh", "-c", &fetch_allowed]);
    assert!(out.starts_with("ERR"), "after a restart: {out}");
    let out = echo_of_secret();
    assert!(
        out.contains(&format!("auth=Bearer {SECRET_VALUE}")),
        "after a restart: {out}"
    );
    ok(&["secret", "rm", "GH"]);
    fails(&["secret", "rm", "GH"], "no secret");
    ok(&["sandbox", "rm", &id]);
    server.stop();
    env.assert_clean();
}
