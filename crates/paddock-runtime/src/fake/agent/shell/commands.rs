//! The interpreter's commands (see the module docs of `shell/` for the list). Messages and exit
//! statuses follow coreutils and dash where a test may look at them.

use std::time::Duration;

use super::{Flow, Io, Shell};
use crate::fake::fs::FsError;

/// Commands that exist as programs (the rest are shell builtins only: `cd`, `exit`, `exec`, `:`).
const PROGRAMS: [&str; 22] = [
    "true", "false", "echo", "printf", "cat", "sleep", "ls", "pwd", "mkdir", "rm", "touch", "hostname",
    "whoami", "id", "env", "test", "[", "sh", "bash", "tar", "ln", "chmod",
];

/// Whether `name` can be spawned as a program.
pub(crate) fn is_program(name: &str) -> bool {
    PROGRAMS.contains(&name)
}

/// Runs one command.
pub(crate) async fn run(shell: &mut Shell, argv: Vec<String>, mut io: Io) -> Flow {
    let args = &argv[1..];
    let status = match argv[0].as_str() {
        "true" | ":" => 0,
        "false" => 1,
        "echo" => echo(shell, args, &io).await,
        "printf" => printf(shell, args, &io).await,
        "cat" => cat(shell, args, &mut io).await,
        "sleep" => return sleep(shell, args, &io).await,
        "exit" => {
            let code = args
                .first()
                .and_then(|a| a.parse::<i32>().ok())
                .unwrap_or(shell.status());
            return Flow::Exit(code & 0xff);
        }
        "exec" if args.is_empty() => 0,
        "exec" => {
            let flow = shell.command(args.to_vec(), io).await;
            let (Flow::Next(code) | Flow::Exit(code)) = flow;
            return Flow::Exit(code);
        }
        "sh" | "bash" => return sh(shell, args, io).await,
        "ls" => ls(shell, args, &io).await,
        "pwd" => {
            let cwd = format!("{}\n", shell.ctx().cwd);
            status(shell.say(&io.out, &cwd).await)
        }
        "cd" => cd(shell, args, &io).await,
        "mkdir" => mkdir(shell, args, &io).await,
        "rm" => rm(shell, args, &io).await,
        "touch" => touch(shell, args, &io).await,
        "hostname" => {
            let name = format!("{}\n", shell.ctx().agent.hostname());
            status(shell.say(&io.out, &name).await)
        }
        "whoami" => {
            let name = format!("{}\n", shell.ctx().user.name);
            status(shell.say(&io.out, &name).await)
        }
        "id" => id(shell, args, &io).await,
        "env" => {
            let text: String = shell
                .ctx()
                .env
                .iter()
                .map(|(k, v)| format!("{k}={v}\n"))
                .collect();
            status(shell.say(&io.out, &text).await)
        }
        "test" => test(shell, args),
        "[" => match args.split_last() {
            Some((last, rest)) if last == "]" => test(shell, rest),
            _ => {
                shell.say(&io.err, "sh: 1: [: missing ]\n").await;
                2
            }
        },
        "tar" => super::tar::tar(shell, args, &mut io).await,
        "ln" => ln(shell, args, &io).await,
        "chmod" => chmod(shell, args, &io).await,
        other => {
            let message = format!("sh: 1: {other}: not found\n");
            shell.say(&io.err, &message).await;
            127
        }
    };
    Flow::Next(status)
}

fn status(ok: bool) -> i32 {
    if ok {
        0
    } else {
        1
    }
}

fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some('0') => out.push('\0'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

async fn echo(shell: &Shell, args: &[String], io: &Io) -> i32 {
    let (mut newline, mut escapes, mut rest) = (true, false, args);
    while let Some(flag) = rest
        .first()
        .filter(|a| a.len() > 1 && a.starts_with('-') && a[1..].chars().all(|c| matches!(c, 'n' | 'e' | 'E')))
    {
        newline &= !flag.contains('n');
        escapes |= flag.contains('e');
        rest = &rest[1..];
    }
    let mut text = rest.join(" ");
    if escapes {
        text = unescape(&text);
    }
    if newline {
        text.push('\n');
    }
    status(shell.say(&io.out, &text).await)
}

async fn printf(shell: &Shell, args: &[String], io: &Io) -> i32 {
    let Some((format, mut rest)) = args.split_first() else {
        shell
            .say(&io.err, "printf: usage: printf format [arguments]\n")
            .await;
        return 2;
    };
    let format = unescape(format);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('s' | 'd' | 'i' | 'u') => {
                if let Some((arg, more)) = rest.split_first() {
                    out.push_str(arg);
                    rest = more;
                }
            }
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    status(shell.say(&io.out, &out).await)
}

async fn cat(shell: &mut Shell, args: &[String], io: &mut Io) -> i32 {
    let files: Vec<String> = if args.is_empty() {
        vec!["-".into()]
    } else {
        args.to_vec()
    };
    let mut code = 0;
    for file in files {
        if file == "-" {
            while let Some(chunk) = shell.read_input(&mut io.input).await {
                if !shell.emit(&io.out, &chunk).await {
                    return 1;
                }
            }
            continue;
        }
        match shell.read_file(&shell.absolute(&file)) {
            Ok(data) => {
                if !shell.emit(&io.out, &data).await {
                    return 1;
                }
            }
            Err(e) => {
                shell
                    .say(&io.err, &format!("cat: {file}: {}\n", os_text(e)))
                    .await;
                code = 1;
            }
        }
    }
    code
}

/// "No such file or directory", without " (os error 2)".
pub(crate) fn os_text(e: FsError) -> String {
    let text = e.io().to_string();
    match text.rfind(" (os error") {
        Some(cut) => text[..cut].to_owned(),
        None => text,
    }
}

fn parse_duration(arg: &str) -> Option<Duration> {
    if matches!(arg, "inf" | "infinity") {
        return Some(Duration::MAX);
    }
    let (number, unit) = match arg.char_indices().last()? {
        (i, 's') => (&arg[..i], 1.0),
        (i, 'm') => (&arg[..i], 60.0),
        (i, 'h') => (&arg[..i], 3600.0),
        (i, 'd') => (&arg[..i], 86400.0),
        _ => (arg, 1.0),
    };
    let seconds: f64 = number.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64((seconds * unit).min(1e12)))
}

async fn sleep(shell: &Shell, args: &[String], io: &Io) -> Flow {
    let mut total = Duration::ZERO;
    for arg in args {
        match parse_duration(arg) {
            Some(d) => total = total.saturating_add(d),
            None => {
                shell
                    .say(&io.err, &format!("sleep: invalid time interval '{arg}'\n"))
                    .await;
                return Flow::Next(1);
            }
        }
    }
    if args.is_empty() {
        shell.say(&io.err, "sleep: missing operand\n").await;
        return Flow::Next(1);
    }
    if total == Duration::MAX {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(total).await;
    Flow::Next(0)
}

async fn sh(shell: &mut Shell, args: &[String], io: Io) -> Flow {
    // A login shell (`bash -l -c ...`, as E2B's SDKs start commands) runs the script the same way:
    // the double has no profile files.
    let login = args.iter().take_while(|a| *a == "-l" || *a == "--login").count();
    match &args[login..] {
        [flag, script, ..] if flag == "-c" => {
            let script = script.clone();
            // The nested script runs in this process; `exit` ends only it.
            let (Flow::Next(code) | Flow::Exit(code)) = shell.script(&script, io).await;
            Flow::Next(code)
        }
        _ => {
            shell
                .say(
                    &io.err,
                    "sh: only `sh -c SCRIPT` is supported by the fake agent\n",
                )
                .await;
            Flow::Next(2)
        }
    }
}

async fn ls(shell: &Shell, args: &[String], io: &Io) -> i32 {
    let all = args.iter().any(|a| a.starts_with('-') && a.contains('a'));
    let paths: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let targets: Vec<String> = if paths.is_empty() {
        vec![".".into()]
    } else {
        paths.into_iter().cloned().collect()
    };
    let mut code = 0;
    let mut text = String::new();
    for target in &targets {
        let path = shell.absolute(target);
        let listed = shell.ctx().agent.read_fs(|fs| {
            let abs = fs.resolve(&path, true)?;
            match fs.node(&abs) {
                Some(node) if node.is_dir() => Ok(Some(fs.list(&path)?)),
                Some(_) => Ok(None),
                None => Err(FsError(libc::ENOENT)),
            }
        });
        match listed {
            Ok(Some(entries)) => {
                if targets.len() > 1 {
                    text.push_str(&format!("{target}:\n"));
                }
                for entry in entries.iter().filter(|e| all || !e.name.starts_with('.')) {
                    text.push_str(&entry.name);
                    text.push('\n');
                }
            }
            Ok(None) => text.push_str(&format!("{target}\n")),
            Err(e) => {
                shell
                    .say(
                        &io.err,
                        &format!("ls: cannot access '{target}': {}\n", os_text(e)),
                    )
                    .await;
                code = 2;
            }
        }
    }
    if !shell.say(&io.out, &text).await {
        return 1;
    }
    code
}

async fn cd(shell: &mut Shell, args: &[String], io: &Io) -> i32 {
    let target = args
        .first()
        .cloned()
        .unwrap_or_else(|| shell.ctx().user.home.clone());
    let path = shell.absolute(&target);
    let resolved = shell.ctx().agent.read_fs(|fs| {
        let abs = fs.resolve(&path, true)?;
        match fs.node(&abs) {
            Some(node) if node.is_dir() => Ok(crate::fake::tree::display(&abs)),
            Some(_) => Err(FsError(libc::ENOTDIR)),
            None => Err(FsError(libc::ENOENT)),
        }
    });
    match resolved {
        Ok(dir) => {
            shell.ctx_mut().cwd = dir;
            0
        }
        Err(_) => {
            shell
                .say(&io.err, &format!("sh: 1: cd: can't cd to {target}\n"))
                .await;
            2
        }
    }
}

async fn mkdir(shell: &Shell, args: &[String], io: &Io) -> i32 {
    let parents = args.iter().any(|a| a == "-p");
    let mut code = 0;
    for dir in args.iter().filter(|a| !a.starts_with('-')) {
        let path = shell.absolute(dir);
        let (_, uid, gid) = shell.owner();
        let made = shell
            .ctx()
            .agent
            .change_fs(|fs| fs.mkdir(&path, parents, (0o755, uid, gid)));
        if let Err(e) = made {
            shell
                .say(
                    &io.err,
                    &format!("mkdir: cannot create directory '{dir}': {}\n", os_text(e)),
                )
                .await;
            code = 1;
        }
    }
    code
}

async fn rm(shell: &Shell, args: &[String], io: &Io) -> i32 {
    let flags: String = args
        .iter()
        .filter(|a| a.starts_with('-'))
        .flat_map(|a| a.chars())
        .collect();
    let (recursive, force) = (flags.contains('r') || flags.contains('R'), flags.contains('f'));
    let mut code = 0;
    for target in args.iter().filter(|a| !a.starts_with('-')) {
        let path = shell.absolute(target);
        let removed = shell.ctx().agent.change_fs(|fs| {
            let entry = fs.stat(&path)?;
            if entry.node.is_dir() && !recursive {
                return Err(FsError(libc::EISDIR));
            }
            fs.remove(&path, recursive)
        });
        match removed {
            Ok(()) => {}
            Err(FsError(libc::ENOENT)) if force => {}
            Err(e) => {
                shell
                    .say(
                        &io.err,
                        &format!("rm: cannot remove '{target}': {}\n", os_text(e)),
                    )
                    .await;
                code = 1;
            }
        }
    }
    code
}

async fn touch(shell: &Shell, args: &[String], io: &Io) -> i32 {
    let mut code = 0;
    for file in args.iter().filter(|a| !a.starts_with('-')) {
        let path = shell.absolute(file);
        let owner = shell.owner();
        if let Err(e) = shell
            .ctx()
            .agent
            .change_fs(|fs| fs.write(&path, 0, false, &[], owner))
        {
            shell
                .say(
                    &io.err,
                    &format!("touch: cannot touch '{file}': {}\n", os_text(e)),
                )
                .await;
            code = 1;
        }
    }
    code
}

/// `ln -s TARGET LINK` (hard links are not kept by the fake's trees).
async fn ln(shell: &Shell, args: &[String], io: &Io) -> i32 {
    let [flag, target, link] = args else {
        shell
            .say(&io.err, "ln: the fake agent supports `ln -s TARGET LINK` only\n")
            .await;
        return 1;
    };
    if flag != "-s" && flag != "-sf" {
        shell
            .say(&io.err, "ln: the fake agent supports `ln -s TARGET LINK` only\n")
            .await;
        return 1;
    }
    let path = shell.absolute(link);
    let (_, uid, gid) = shell.owner();
    let made = shell.ctx().agent.change_fs(|fs| {
        if flag == "-sf" {
            let _ = fs.remove(&path, false);
        }
        fs.symlink(&path, target, (uid, gid))
    });
    match made {
        Ok(()) => 0,
        Err(e) => {
            let message = format!("ln: failed to create symbolic link '{link}': {}\n", os_text(e));
            shell.say(&io.err, &message).await;
            1
        }
    }
}

/// `chmod OCTAL PATH...`.
async fn chmod(shell: &Shell, args: &[String], io: &Io) -> i32 {
    let Some((mode, paths)) = args.split_first() else {
        shell.say(&io.err, "chmod: missing operand\n").await;
        return 1;
    };
    let Ok(mode) = u32::from_str_radix(mode, 8) else {
        shell
            .say(
                &io.err,
                &format!("chmod: invalid mode: '{mode}' (the fake agent takes octal modes)\n"),
            )
            .await;
        return 1;
    };
    let mut code = 0;
    for p in paths {
        let path = shell.absolute(p);
        if let Err(e) = shell.ctx().agent.change_fs(|fs| fs.chmod(&path, mode)) {
            let message = format!("chmod: cannot access '{p}': {}\n", os_text(e));
            shell.say(&io.err, &message).await;
            code = 1;
        }
    }
    code
}

async fn id(shell: &Shell, args: &[String], io: &Io) -> i32 {
    let user = &shell.ctx().user;
    let text = match args.first().map(String::as_str) {
        Some("-un" | "-nu") => format!("{}\n", user.name),
        Some("-u") => format!("{}\n", user.uid),
        Some("-g") => format!("{}\n", user.gid),
        _ => format!("uid={}({}) gid={}\n", user.uid, user.name, user.gid),
    };
    status(shell.say(&io.out, &text).await)
}

fn test(shell: &Shell, args: &[String]) -> i32 {
    let kind = |path: &str| {
        let path = shell.absolute(path);
        shell
            .ctx()
            .agent
            .read_fs(|fs| {
                let abs = fs.resolve(&path, true)?;
                Ok(fs.node(&abs).map(|n| (n.is_dir(), n.size())))
            })
            .ok()
            .flatten()
    };
    let truth = match args {
        [] => false,
        [one] => !one.is_empty(),
        [flag, path] if flag == "-e" => kind(path).is_some(),
        [flag, path] if flag == "-f" => kind(path).is_some_and(|(dir, _)| !dir),
        [flag, path] if flag == "-d" => kind(path).is_some_and(|(dir, _)| dir),
        [flag, path] if flag == "-s" => kind(path).is_some_and(|(_, size)| size > 0),
        [flag, text] if flag == "-n" => !text.is_empty(),
        [flag, text] if flag == "-z" => text.is_empty(),
        [bang, rest @ ..] if bang == "!" => return 1 - test(shell, rest).min(1),
        [a, op, b] if op == "=" => a == b,
        [a, op, b] if op == "!=" => a != b,
        _ => return 2,
    };
    i32::from(!truth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_escapes() {
        assert_eq!(parse_duration("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("x"), None);
        assert_eq!(parse_duration("-1"), None);
        assert_eq!(unescape("a\\nb\\tc\\\\"), "a\nb\tc\\");
        assert!(is_program("cat") && !is_program("cd") && !is_program("exit"));
    }
}
