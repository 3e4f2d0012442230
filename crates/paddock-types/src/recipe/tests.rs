use std::fmt::Write as _;

use super::*;

use proptest::prelude::*;

fn no_args() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn parse(text: &str) -> Recipe {
    parse_recipe(text, &no_args()).unwrap_or_else(|e| panic!("{text:?} refused: {e}"))
}

fn parse_with(text: &str, args: &[(&str, &str)]) -> Recipe {
    let args = args
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    parse_recipe(text, &args).unwrap_or_else(|e| panic!("{text:?} refused: {e}"))
}

fn refuse(text: &str) -> RecipeError {
    match parse_recipe(text, &no_args()) {
        Ok(r) => panic!("{text:?} accepted: {r:?}"),
        Err(e) => e,
    }
}

/// Refused at `line` with a message containing `needle`.
fn assert_refused(text: &str, line: usize, needle: &str) {
    let e = refuse(text);
    assert_eq!(e.line, line, "{text:?}: {e}");
    assert!(e.message.contains(needle), "{text:?}: {e:?} lacks {needle:?}");
}

/// The single step of `FROM alpine` followed by `body`.
fn step(body: &str) -> Instruction {
    let r = parse(&format!("FROM alpine\n{body}\n"));
    assert_eq!(r.steps.len(), 1, "{body:?}: {:?}", r.steps);
    r.steps.into_iter().next().expect("one step").instruction
}

fn s(v: &str) -> String {
    v.to_owned()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| s(x)).collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(k, v)| (s(k), s(v))).collect()
}

fn env(body: &str) -> Vec<(String, String)> {
    match step(body) {
        Instruction::Env { vars } => vars,
        other => panic!("{body:?}: {other:?}"),
    }
}

#[test]
fn a_full_recipe() {
    let text = "\
# syntax=docker/dockerfile:1
ARG BASE=python:3.12-slim
FROM ${BASE}

# dependencies
ENV APP_HOME=/srv/app PIP_NO_CACHE_DIR=1
WORKDIR $APP_HOME
COPY --chown=app:app requirements.txt ./
RUN pip install -r requirements.txt && \\
    useradd app
USER app
LABEL org.opencontainers.image.title=\"demo app\"
EXPOSE 8000 9000/udp
ENTRYPOINT [\"python\", \"-m\", \"app\"]
CMD --port=8000
";
    let r = parse(text);
    assert_eq!(r.from, "python:3.12-slim");
    let lines: Vec<usize> = r.steps.iter().map(|s| s.line).collect();
    assert_eq!(lines, [6, 7, 8, 9, 11, 12, 13, 14, 15]);
    let want = vec![
        Instruction::Env {
            vars: pairs(&[("APP_HOME", "/srv/app"), ("PIP_NO_CACHE_DIR", "1")]),
        },
        Instruction::Workdir { path: s("/srv/app") },
        Instruction::Copy {
            sources: strings(&["requirements.txt"]),
            dest: s("/srv/app/"),
            chown: Some(s("app:app")),
        },
        Instruction::Run {
            command: Command::Shell(s("pip install -r requirements.txt &&     useradd app")),
            arg_env: vec![],
        },
        Instruction::User { user: s("app") },
        Instruction::Label {
            labels: pairs(&[("org.opencontainers.image.title", "demo app")]),
        },
        Instruction::Expose {
            ports: strings(&["8000/tcp", "9000/udp"]),
        },
        Instruction::Entrypoint {
            command: Command::Exec(strings(&["python", "-m", "app"])),
        },
        Instruction::Cmd {
            command: Command::Shell(s("--port=8000")),
        },
    ];
    let got: Vec<Instruction> = r.steps.into_iter().map(|s| s.instruction).collect();
    assert_eq!(got, want);
}

#[test]
fn keywords_are_case_insensitive_and_spacing_is_free() {
    let r = parse("  from   alpine:3  \n\trun\techo hi  \nWorkDir   /x\n");
    assert_eq!(r.from, "alpine:3");
    assert_eq!(
        r.steps[0].instruction,
        Instruction::Run {
            command: Command::Shell(s("echo hi")),
            arg_env: vec![]
        }
    );
    assert_eq!(r.steps[1].instruction, Instruction::Workdir { path: s("/x") });
    // CRLF line ends and a byte order mark.
    let r = parse("\u{feff}FROM alpine\r\nUSER root\r\n");
    assert_eq!(r.steps[0].instruction, Instruction::User { user: s("root") });
}

#[test]
fn run_cmd_entrypoint_forms() {
    let shell = |t: &str| Command::Shell(s(t));
    let run = |body: &str| match step(body) {
        Instruction::Run { command, .. } => command,
        other => panic!("{other:?}"),
    };
    assert_eq!(run("RUN echo $HOME ${X:-y}"), shell("echo $HOME ${X:-y}"));
    assert_eq!(
        run(r#"RUN ["/bin/echo", "a b", "$HOME"]"#),
        Command::Exec(strings(&["/bin/echo", "a b", "$HOME"]))
    );
    // Not a JSON array of strings: the shell form, as docker.
    assert_eq!(
        run("RUN [ -f /etc/os-release ] && echo yes"),
        shell("[ -f /etc/os-release ] && echo yes")
    );
    assert_eq!(run("RUN ['single', 'quotes']"), shell("['single', 'quotes']"));
    assert_eq!(run("RUN [1, 2]"), shell("[1, 2]"));
    // A `#` inside an instruction is not a comment.
    assert_eq!(run("RUN echo # not a comment"), shell("echo # not a comment"));

    assert_eq!(
        step("CMD [\"serve\"]"),
        Instruction::Cmd {
            command: Command::Exec(strings(&["serve"]))
        }
    );
    assert_eq!(
        step("CMD []"),
        Instruction::Cmd {
            command: Command::Exec(vec![])
        }
    );
    assert_eq!(
        step("cmd serve --all"),
        Instruction::Cmd {
            command: shell("serve --all")
        }
    );
    assert_eq!(
        step("ENTRYPOINT exec /app \"$@\""),
        Instruction::Entrypoint {
            command: shell("exec /app \"$@\"")
        }
    );
    assert_eq!(
        step("ENTRYPOINT [\"/tini\", \"--\"]"),
        Instruction::Entrypoint {
            command: Command::Exec(strings(&["/tini", "--"]))
        }
    );

    assert_eq!(shell("make all").argv(), strings(&["/bin/sh", "-c", "make all"]));
    assert_eq!(
        Command::Exec(strings(&["make", "all"])).argv(),
        strings(&["make", "all"])
    );
}

#[test]
fn empty_commands_are_refused() {
    assert_refused("FROM a\nRUN\n", 2, "RUN needs a command");
    assert_refused("FROM a\nRUN []\n", 2, "RUN needs a command");
    assert_refused("FROM a\n\nCMD\n", 3, "CMD needs a command");
    assert_refused("FROM a\nENTRYPOINT   \n", 2, "ENTRYPOINT needs a command");
    assert_refused("FROM a\nRUN [\"a\\u0000b\"]\n", 2, "NUL");
}

#[test]
fn env_forms() {
    assert_eq!(env("ENV A=1"), pairs(&[("A", "1")]));
    assert_eq!(
        env(r#"ENV A=1 B="two words" C='single $quoted' D=esc\ aped E="q\"uote" F="\$dollar""#),
        pairs(&[
            ("A", "1"),
            ("B", "two words"),
            ("C", "single $quoted"),
            ("D", "esc aped"),
            ("E", "q\"uote"),
            ("F", "$dollar"),
        ])
    );
    // Other backslashes inside double quotes stay.
    assert_eq!(env(r#"ENV A="a\nb""#), pairs(&[("A", "a\\nb")]));
    // An empty value.
    assert_eq!(env("ENV A= B=\"\""), pairs(&[("A", ""), ("B", "")]));
    // The legacy form: the rest of the line is the value.
    assert_eq!(
        env("ENV GREETING hello   big world"),
        pairs(&[("GREETING", "hello   big world")])
    );
    assert_eq!(
        env("ENV GREETING \"quoted value\""),
        pairs(&[("GREETING", "quoted value")])
    );
    assert_eq!(env("ENV URL=http://x/?a=b"), pairs(&[("URL", "http://x/?a=b")]));

    assert_refused("FROM a\nENV\n", 2, "ENV needs NAME=value");
    assert_refused("FROM a\nENV A\n", 2, "needs a value");
    assert_refused("FROM a\nENV A=1 B\n", 2, "expected NAME=value");
    assert_refused("FROM a\nENV =1\n", 2, "name is empty");
    assert_refused("FROM a\nENV \"A B\"=1\n", 2, "invalid ENV name");
    assert_refused("FROM a\nENV A=\"open\n", 2, "unterminated double quote");
    assert_refused("FROM a\nENV A='open\n", 2, "unterminated single quote");
}

#[test]
fn label_forms() {
    assert_eq!(
        step(r#"LABEL "com.example.vendor"="ACME Inc" version=1.0 description="a \"b\"""#),
        Instruction::Label {
            labels: pairs(&[
                ("com.example.vendor", "ACME Inc"),
                ("version", "1.0"),
                ("description", "a \"b\"")
            ])
        }
    );
    assert_eq!(
        step("LABEL maintainer me@example.com"),
        Instruction::Label {
            labels: pairs(&[("maintainer", "me@example.com")])
        }
    );
    assert_refused("FROM a\nLABEL\n", 2, "LABEL needs NAME=value");
}

#[test]
fn continuation_lines_and_comments() {
    let text = "\
FROM alpine
RUN apk add \\
# a comment inside the continuation
    curl \\
   # an indented one

    git
# a comment
   # an indented comment
ENV A=1 \\
    B=2
RUN echo done \\
";
    let r = parse(text);
    assert_eq!(r.steps.len(), 3);
    assert_eq!(r.steps[0].line, 2);
    assert_eq!(
        r.steps[0].instruction,
        Instruction::Run {
            command: Command::Shell(s("apk add     curl     git")),
            arg_env: vec![]
        }
    );
    assert_eq!(r.steps[1].line, 10);
    assert_eq!(
        r.steps[1].instruction,
        Instruction::Env {
            vars: pairs(&[("A", "1"), ("B", "2")])
        }
    );
    // A continuation at the end of the text ends the instruction.
    assert_eq!(r.steps[2].line, 12);
    assert_eq!(
        r.steps[2].instruction,
        Instruction::Run {
            command: Command::Shell(s("echo done")),
            arg_env: vec![]
        }
    );
    // Blanks after the backslash still continue; the keyword may be split too.
    let r = parse("FROM alpine\nWORK\\  \nDIR /x\n");
    assert_eq!(r.steps[0].instruction, Instruction::Workdir { path: s("/x") });
}

#[test]
fn parser_directives() {
    let r = parse("# syntax=docker/dockerfile:1.7\n# escape=\\\nFROM alpine\n");
    assert_eq!(r.from, "alpine");
    let r = parse("#Escape = \\\n# syntax = x\nFROM alpine\n");
    assert_eq!(r.from, "alpine");
    assert_refused(
        "# escape=`\nFROM alpine\n",
        1,
        "escape parser directive \"`\" is not supported",
    );
    assert_refused("# syntax=a\n#ESCAPE=`\nFROM alpine\n", 2, "escape");
    assert_refused("# syntax=a\n# syntax=b\nFROM alpine\n", 2, "given twice");
    // After an instruction, a comment or a blank line, a directive is only a comment.
    parse("# a comment\n# escape=`\nFROM alpine\n");
    parse("\n# escape=`\nFROM alpine\n");
    parse("FROM alpine\n# escape=`\n");
    // An unknown directive is a comment and ends the directives.
    parse("# foo=bar\n# escape=`\nFROM alpine\n");
}

#[test]
fn substitution_forms() {
    let pre = "FROM alpine\nARG SET=value\nARG EMPTY=\n";
    let w = |expr: &str| match parse(&format!("{pre}WORKDIR /{expr}\n")).steps[0]
        .instruction
        .clone()
    {
        Instruction::Workdir { path } => path,
        other => panic!("{other:?}"),
    };
    assert_eq!(w("$SET"), "/value");
    assert_eq!(w("${SET}x"), "/valuex");
    assert_eq!(w("$SETx"), "/");
    assert_eq!(w("${SET:-dflt}"), "/value");
    assert_eq!(w("${EMPTY:-dflt}"), "/dflt");
    assert_eq!(w("${UNSET:-dflt}"), "/dflt");
    assert_eq!(w("${SET:+alt}"), "/alt");
    assert_eq!(w("${EMPTY:+alt}"), "/");
    assert_eq!(w("${UNSET:+alt}"), "/");
    assert_eq!(w("$UNSET"), "/");
    // Nested, and a default holding a substitution.
    assert_eq!(w("${UNSET:-${SET}-more}"), "/value-more");
    assert_eq!(w("${UNSET:-${ALSO:-deep}}"), "/deep");
    // Escaped and lone dollars.
    assert_eq!(w("\\$SET"), "/$SET");
    assert_eq!(w("a$"), "/a$");
    assert_eq!(w("a$/b"), "/a$/b");
    assert_eq!(w("$1"), "/$1");
    // Single quotes keep a dollar; double quotes substitute.
    assert_eq!(w("'$SET'"), "/$SET");
    assert_eq!(w("\"$SET\""), "/value");

    assert_refused(&format!("{pre}WORKDIR ${{SET\n"), 4, "missing }");
    assert_refused(&format!("{pre}WORKDIR ${{SET:-x\n"), 4, "missing }");
    assert_refused(&format!("{pre}WORKDIR ${{}}\n"), 4, "bad substitution");
    assert_refused(
        &format!("{pre}WORKDIR ${{SET-x}}\n"),
        4,
        "unsupported substitution",
    );
    assert_refused(
        &format!("{pre}WORKDIR ${{SET:=x}}\n"),
        4,
        "unsupported substitution",
    );
    assert_refused(
        &format!("{pre}WORKDIR ${{SET#x}}\n"),
        4,
        "unsupported substitution",
    );
    let deep = format!("{}x{}", "${A:-".repeat(40), "}".repeat(40));
    assert_refused(&format!("{pre}WORKDIR {deep}\n"), 4, "nested too deeply");
}

#[test]
fn substitution_applies_where_docker_does() {
    let r = parse_with(
        "\
ARG V=1
FROM alpine:$V
ARG V
ARG P=8080
ARG U=app
ARG D=data
ENV HOME_DIR=/home/$U
WORKDIR $HOME_DIR
USER ${U}:${U}
LABEL version=$V
EXPOSE $P
COPY --chown=$U $D/ ${D}-out/
ADD $D.tar /opt/
RUN echo $V
CMD echo $V
ENTRYPOINT echo $V
",
        &[],
    );
    assert_eq!(r.from, "alpine:1");
    let got: Vec<Instruction> = r.steps.into_iter().map(|s| s.instruction).collect();
    let arg_env = pairs(&[("D", "data"), ("P", "8080"), ("U", "app"), ("V", "1")]);
    assert_eq!(
        got,
        vec![
            Instruction::Env {
                vars: pairs(&[("HOME_DIR", "/home/app")])
            },
            Instruction::Workdir { path: s("/home/app") },
            Instruction::User { user: s("app:app") },
            Instruction::Label {
                labels: pairs(&[("version", "1")])
            },
            Instruction::Expose {
                ports: strings(&["8080/tcp"])
            },
            Instruction::Copy {
                sources: strings(&["data"]),
                dest: s("/home/app/data-out/"),
                chown: Some(s("app"))
            },
            Instruction::Add {
                sources: strings(&["data.tar"]),
                dest: s("/opt/"),
                chown: None
            },
            Instruction::Run {
                command: Command::Shell(s("echo $V")),
                arg_env
            },
            Instruction::Cmd {
                command: Command::Shell(s("echo $V"))
            },
            Instruction::Entrypoint {
                command: Command::Shell(s("echo $V"))
            },
        ]
    );
}

#[test]
fn args_before_from_and_build_args() {
    // A default, overridden by a build argument.
    let text = "ARG TAG=3.19\nARG IMAGE=alpine\nFROM $IMAGE:${TAG}\n";
    assert_eq!(parse(text).from, "alpine:3.19");
    assert_eq!(parse_with(text, &[("TAG", "edge")]).from, "alpine:edge");
    // An ARG without a default takes the build argument, else is empty.
    assert_eq!(
        parse_with("ARG R\nFROM ${R:-docker.io}/alpine\n", &[]).from,
        "docker.io/alpine"
    );
    assert_eq!(
        parse_with("ARG R\nFROM ${R:-docker.io}/alpine\n", &[("R", "quay.io")]).from,
        "quay.io/alpine"
    );
    // Undeclared build arguments are ignored.
    assert_eq!(parse_with("FROM alpine$X\n", &[("X", ":bad")]).from, "alpine");
    // A build argument's value is taken as is.
    let r = parse_with("FROM a\nARG X=d\nWORKDIR /$X\n", &[("X", "$Y")]);
    assert_eq!(r.steps[0].instruction, Instruction::Workdir { path: s("/$Y") });
    // Several ARGs at once; a default may use an earlier ARG.
    let r = parse("FROM a\nARG A=x B=${A}y\nWORKDIR /$B\n");
    assert_eq!(r.steps[0].instruction, Instruction::Workdir { path: s("/xy") });

    // An ARG before FROM is not in scope after it unless declared again.
    let r = parse("ARG V=1\nFROM a\nWORKDIR /v$V\nARG V\nUSER u$V\n");
    assert_eq!(r.steps[0].instruction, Instruction::Workdir { path: s("/v") });
    assert_eq!(r.steps[1].instruction, Instruction::User { user: s("u1") });
    let r = parse_with("ARG V=1\nFROM a\nARG V\nUSER u$V\n", &[("V", "9")]);
    assert_eq!(r.steps[0].instruction, Instruction::User { user: s("u9") });
    // ENV is not in scope in FROM (there is none before it) and ARGs after FROM are not in FROM.
    assert_refused("FROM $LATER\nARG LATER=alpine\n", 1, "FROM names no image");

    assert_refused("FROM a\nARG\n", 2, "ARG needs a name");
    assert_refused("FROM a\nARG 1X=2\n", 2, "invalid ARG name");
    assert_refused("FROM a\nARG A-B\n", 2, "invalid ARG name");
}

#[test]
fn env_wins_over_arg() {
    let r = parse_with(
        "FROM a\nARG V=arg\nENV V=env\nWORKDIR /$V\nARG V=again\nUSER $V\nRUN true\n",
        &[("V", "build")],
    );
    let got: Vec<Instruction> = r.steps.into_iter().map(|s| s.instruction).collect();
    assert_eq!(
        got[0],
        Instruction::Env {
            vars: pairs(&[("V", "env")])
        }
    );
    assert_eq!(got[1], Instruction::Workdir { path: s("/env") });
    assert_eq!(got[2], Instruction::User { user: s("env") });
    // The RUN does not get the shadowed ARG.
    assert_eq!(
        got[3],
        Instruction::Run {
            command: Command::Shell(s("true")),
            arg_env: vec![]
        }
    );
    // Before the ENV, the ARG (here a build argument) applies.
    let r = parse_with("FROM a\nARG V=arg\nUSER $V\nENV V=env\n", &[("V", "build")]);
    assert_eq!(r.steps[0].instruction, Instruction::User { user: s("build") });
    // The values of one ENV see the variables as they were before it.
    assert_eq!(
        parse("FROM a\nENV A=1\nENV A=2 B=$A\n").steps[1].instruction,
        Instruction::Env {
            vars: pairs(&[("A", "2"), ("B", "1")])
        }
    );
    // A RUN's ARG environment follows the ARGs in scope.
    let r = parse_with("FROM a\nRUN one\nARG X\nARG Y=y\nRUN two\n", &[("X", "x")]);
    assert_eq!(
        r.steps[0].instruction,
        Instruction::Run {
            command: Command::Shell(s("one")),
            arg_env: vec![]
        }
    );
    assert_eq!(
        r.steps[1].instruction,
        Instruction::Run {
            command: Command::Shell(s("two")),
            arg_env: pairs(&[("X", "x"), ("Y", "y")])
        }
    );
}

#[test]
fn workdir_resolution() {
    let r = parse(
        "FROM a\nWORKDIR a/../b\nWORKDIR c\nWORKDIR ./d//e/.\nWORKDIR ..\nWORKDIR /x/../../y/\nWORKDIR /\n",
    );
    let paths: Vec<String> = r
        .steps
        .into_iter()
        .map(|s| match s.instruction {
            Instruction::Workdir { path } => path,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(paths, strings(&["/b", "/b/c", "/b/c/d/e", "/b/c/d", "/y", "/"]));
    assert_eq!(
        step("WORKDIR \"/with space\""),
        Instruction::Workdir {
            path: s("/with space")
        }
    );
    assert_refused("FROM a\nWORKDIR\n", 2, "WORKDIR needs a path");
    assert_refused("FROM a\nWORKDIR $NOTHING\n", 2, "WORKDIR needs a path");
}

#[test]
fn user() {
    assert_eq!(step("USER 1000:1000"), Instruction::User { user: s("1000:1000") });
    assert_refused("FROM a\nUSER\n", 2, "USER needs a user");
    assert_refused("FROM a\nUSER a b\n", 2, "invalid USER");
}

#[test]
fn expose() {
    assert_eq!(
        step("EXPOSE 80 443/TCP 53/udp 65535 1 080"),
        Instruction::Expose {
            ports: strings(&["80/tcp", "443/tcp", "53/udp", "65535/tcp", "1/tcp", "80/tcp"])
        }
    );
    // A variable holding several ports.
    let r = parse("FROM a\nARG PORTS=\"1 2/udp\"\nEXPOSE $PORTS\n");
    assert_eq!(
        r.steps[0].instruction,
        Instruction::Expose {
            ports: strings(&["1/tcp", "2/udp"])
        }
    );
    for bad in [
        "0",
        "65536",
        "99999999999999999999",
        "80/sctp",
        "8000-8010",
        "http",
        "-1",
        "+80",
        "80/",
        "/tcp",
        "8 0/tcp/x",
    ] {
        assert_refused(&format!("FROM a\n\nEXPOSE 22 {bad}\n"), 3, "invalid EXPOSE port");
    }
    assert_refused("FROM a\nEXPOSE\n", 2, "EXPOSE needs a port");
}

#[test]
fn copy_and_add() {
    assert_eq!(
        step("COPY ./src/ ./README.md /app/"),
        Instruction::Copy {
            sources: strings(&["src", "README.md"]),
            dest: s("/app/"),
            chown: None
        }
    );
    assert_eq!(
        step("COPY . ."),
        Instruction::Copy {
            sources: strings(&["."]),
            dest: s("/"),
            chown: None
        }
    );
    assert_eq!(
        step("COPY a.txt /etc/b.txt"),
        Instruction::Copy {
            sources: strings(&["a.txt"]),
            dest: s("/etc/b.txt"),
            chown: None
        }
    );
    assert_eq!(
        step("COPY [\"with space\", \"*.py\", \"/dst dir/\"]"),
        Instruction::Copy {
            sources: strings(&["with space", "*.py"]),
            dest: s("/dst dir/"),
            chown: None
        }
    );
    assert_eq!(
        step("add --chown=1000:1000 \"a b\" dir/x /opt/../srv/"),
        Instruction::Add {
            sources: strings(&["a b", "dir/x"]),
            dest: s("/srv/"),
            chown: Some(s("1000:1000"))
        }
    );
    // A relative destination is resolved against the WORKDIR.
    let r = parse("FROM a\nWORKDIR /app\nCOPY x sub\nCOPY y ../up/\nCOPY z .\n");
    let dests: Vec<String> = r.steps[1..]
        .iter()
        .map(|s| match &s.instruction {
            Instruction::Copy { dest, .. } => dest.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(dests, strings(&["/app/sub", "/up/", "/app/"]));
}

#[test]
fn copy_and_add_refusals() {
    assert_refused("FROM a\nCOPY /etc/passwd /x\n", 2, "is absolute");
    assert_refused("FROM a\nCOPY ../secret /x\n", 2, "leaves the build context");
    assert_refused("FROM a\nCOPY ok a/../../b /x/\n", 2, "leaves the build context");
    assert_refused("FROM a\nCOPY a/.. /x/\n", 2, "leaves the build context");
    assert_refused(
        "FROM a\nARG UP=..\nCOPY $UP/x /x\n",
        3,
        "leaves the build context",
    );
    assert_refused("FROM a\nADD https://example.com/f.tgz /x/\n", 2, "is a URL");
    assert_refused("FROM a\nADD git@github.com:o/r.git /src/\n", 2, "is a URL");
    assert_refused("FROM a\nCOPY http://example.com/f /x\n", 2, "is a URL");
    assert_refused(
        "FROM a\nCOPY --from=builder /app /app\n",
        2,
        "unsupported flag \"--from\" on COPY",
    );
    assert_refused(
        "FROM a\nADD --chmod=755 x /x\n",
        2,
        "unsupported flag \"--chmod\"",
    );
    assert_refused("FROM a\nCOPY --link x /x\n", 2, "unsupported flag \"--link\"");
    assert_refused("FROM a\nCOPY --chown x /x\n", 2, "--chown needs a value");
    assert_refused("FROM a\nCOPY --chown=a --chown=b x /x\n", 2, "given twice");
    assert_refused("FROM a\nCOPY --chown= x /x\n", 2, "invalid COPY --chown");
    assert_refused("FROM a\nCOPY x\n", 2, "needs a source and a destination");
    assert_refused("FROM a\nCOPY\n", 2, "needs a source and a destination");
    assert_refused("FROM a\nCOPY [\"x\"]\n", 2, "needs a source and a destination");
    assert_refused("FROM a\nCOPY a b /dir\n", 2, "several sources");
    assert_refused("FROM a\nCOPY \"\" /x\n", 2, "source is empty");
    assert_refused("FROM a\nCOPY x $NOTHING\n", 2, "destination is empty");
    assert_refused("FROM a\nCOPY x \"\"\n", 2, "destination is empty");
}

#[test]
fn other_flags_are_refused() {
    assert_refused(
        "FROM a\nRUN --mount=type=cache,target=/root/.cache pip install x\n",
        2,
        "unsupported flag \"--mount\" on RUN",
    );
    assert_refused(
        "FROM --platform=linux/arm64 alpine\n",
        1,
        "unsupported flag \"--platform\" on FROM",
    );
}

#[test]
fn from_rules() {
    assert_refused("", 1, "empty");
    assert_refused("# only a comment\n\n", 1, "empty");
    assert_refused("ARG A=1\n", 1, "no FROM");
    assert_refused(
        "ARG A=1\nRUN echo\nFROM a\n",
        2,
        "FROM must be the first instruction",
    );
    assert_refused("\n\nENV A=1\n", 3, "FROM must be the first instruction");
    assert_refused(
        "FROM golang AS build\nRUN go build\n",
        1,
        "multi-stage recipes are not supported",
    );
    assert_refused("FROM golang as build\n", 1, "multi-stage");
    assert_refused(
        "FROM alpine\nRUN true\nFROM debian\n",
        3,
        "multi-stage recipes are not supported",
    );
    assert_refused("FROM scratch\n", 1, "FROM scratch is not supported: use an image");
    assert_refused("ARG B=SCRATCH\nFROM $B\n", 2, "FROM scratch");
    assert_refused("FROM\n", 1, "FROM needs an image");
    assert_refused("FROM a b\n", 1, "FROM takes one image reference");
    assert_refused("ARG I=\"a b\"\nFROM $I\n", 2, "invalid image reference");
    assert_refused("FROM $NOTHING\n", 1, "FROM names no image");
    // A FROM alone is a recipe with no steps.
    assert_eq!(
        parse("FROM docker.io/library/alpine@sha256:abc\n"),
        Recipe {
            from: s("docker.io/library/alpine@sha256:abc"),
            steps: vec![]
        }
    );
}

#[test]
fn unsupported_instructions_are_named() {
    for (kw, line) in [
        (
            "HEALTHCHECK CMD curl -f http://localhost/",
            "HEALTHCHECK is not supported",
        ),
        ("onbuild RUN x", "ONBUILD is not supported"),
        ("STOPSIGNAL SIGTERM", "STOPSIGNAL is not supported"),
        ("SHELL [\"/bin/bash\", \"-c\"]", "SHELL is not supported"),
        ("VOLUME /data", "VOLUME is not supported"),
        ("MAINTAINER me", "MAINTAINER is not supported"),
        (
            "FROBNICATE now",
            "unknown instruction \"FROBNICATE\" is not supported",
        ),
        (
            "apt-get install x",
            "unknown instruction \"apt-get\" is not supported",
        ),
    ] {
        assert_refused(&format!("FROM a\nRUN ok\n{kw}\n"), 3, line);
    }
    // Unknown before FROM is named too.
    assert_refused("VOLUME /x\nFROM a\n", 1, "VOLUME is not supported");
}

#[test]
fn size_bounds() {
    let mut big = String::from("FROM a\n");
    while big.len() <= MAX_RECIPE_BYTES {
        big.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    assert_refused(&big, 1, "more than the limit");

    let mut many = String::from("FROM a\n");
    for _ in 1..MAX_INSTRUCTIONS {
        many.push_str("RUN true\n");
    }
    assert_eq!(parse(&many).steps.len(), MAX_INSTRUCTIONS - 1);
    many.push_str("\n# one more\nRUN true\n");
    assert_refused(&many, MAX_INSTRUCTIONS + 3, "more than 1000 instructions");

    // Substitution cannot blow up: each word and the whole recipe are bounded.
    let mut doubling = String::from("FROM a\nARG A=0123456789abcdef\n");
    for _ in 0..40 {
        doubling.push_str("ARG A=$A$A\n");
    }
    let e = refuse(&doubling);
    assert!(e.message.contains("longer than"), "{e}");
    let mut wide = String::from("FROM a\nARG A=0123456789abcdef\n");
    for _ in 0..12 {
        wide.push_str("ARG A=$A$A\n");
    }
    for _ in 0..400 {
        wide.push_str("ENV B=$A\n");
    }
    let e = refuse(&wide);
    assert!(e.message.contains("add up to more than"), "{e}");

    assert_refused("FROM a\nRUN a\0b\n", 2, "NUL");
    assert_refused(
        "FROM a\nCOPY [\"a\\u0000b\", \"/x\"]\n",
        2,
        "source contains a NUL",
    );
    assert_refused(
        "FROM a\nCOPY [\"a\", \"/x\\u0000\"]\n",
        2,
        "destination contains a NUL",
    );

    // Many variables and ports: parsing and applying them takes no quadratic time.
    let mut wide = String::from("FROM a\nENV");
    let mut ports = String::from("\nEXPOSE");
    for i in 0..50_000 {
        write!(wide, " V{i}={i}").expect("write");
        write!(ports, " {}", i % 65535 + 1).expect("write");
    }
    wide.push_str(&ports);
    let config = parse(&wide).image_config(&ImageConfig::default());
    assert_eq!(config.env.len(), 50_000);
    assert_eq!(config.exposed_ports.len(), 50_000);
}

#[test]
fn cache_text_is_canonical() {
    let same = [
        ("RUN echo hi", "  run    echo hi   "),
        ("RUN [\"a\", \"b c\"]", "RUN   [ \"a\",\"b c\" ]"),
        ("ENV A=1 B=\"x y\"", "env A=\"1\" B=x\\ y"),
        ("ENV B=\"x y\"", "ENV B x y"),
        ("ENV B=\"x y\"", "ENV B='x y'"),
        ("LABEL a=b", "label \"a\"=\"b\""),
        ("WORKDIR /a/b", "WORKDIR /a/./c/../b/"),
        ("USER app", "user \"app\""),
        ("EXPOSE 80 53/udp", "EXPOSE 80/tcp 53/UDP"),
        ("CMD [\"x\"]", "cmd [ \"x\" ]"),
        ("ENTRYPOINT x", "ENTRYPOINT      x"),
        ("COPY a b /d/", "copy ./a b/ /x/../d/"),
        ("COPY a /d/", "COPY [\"./a\", \"/d/\"]"),
        ("ADD --chown=u a /d", "ADD   --chown=\"u\"   a   /d"),
        ("RUN echo\\\n  hi", "RUN echo  hi"),
    ];
    for (a, b) in same {
        let (a, b) = (step(a), step(b));
        let (a, b) = (
            Step {
                line: 1,
                instruction: a,
            },
            Step {
                line: 7,
                instruction: b,
            },
        );
        assert_eq!(a.cache_text(), b.cache_text(), "{a:?} vs {b:?}");
    }
    let different = [
        ("RUN echo hi", "RUN echo  hi"),
        ("RUN echo hi", "RUN [\"echo\", \"hi\"]"),
        ("RUN echo hi", "CMD echo hi"),
        ("CMD echo hi", "ENTRYPOINT echo hi"),
        ("ENV A=1", "ENV A=2"),
        ("ENV A=1 B=2", "ENV B=2 A=1"),
        ("ENV A=1", "LABEL A=1"),
        ("ENV A=\"1 B=2\"", "ENV A=1 B=2"),
        ("WORKDIR /a", "WORKDIR /b"),
        ("USER a", "USER b"),
        ("EXPOSE 80", "EXPOSE 80/udp"),
        ("COPY a /d/", "ADD a /d/"),
        ("COPY a /d/", "COPY a /d"),
        ("COPY a /d/", "COPY --chown=u a /d/"),
        ("COPY a b /d/", "COPY \"a b\" /d/"),
        ("COPY a /d/", "COPY a /e/"),
    ];
    for (a, b) in different {
        let (a, b) = (
            Step {
                line: 1,
                instruction: step(a),
            },
            Step {
                line: 1,
                instruction: step(b),
            },
        );
        assert_ne!(a.cache_text(), b.cache_text(), "{a:?} vs {b:?}");
    }
    // A changed build argument changes the cache text of the RUNs after its ARG.
    let run_text = |v: &str| parse_with("FROM a\nARG V\nRUN make\n", &[("V", v)]).steps[0].cache_text();
    assert_ne!(run_text("1"), run_text("2"));
    // Quoting is unambiguous.
    let a = Step {
        line: 1,
        instruction: Instruction::Env {
            vars: pairs(&[("A", "1\",\"B\"=\"2")]),
        },
    };
    let b = Step {
        line: 1,
        instruction: Instruction::Env {
            vars: pairs(&[("A", "1"), ("B", "2")]),
        },
    };
    assert_ne!(a.cache_text(), b.cache_text());
    assert_eq!(
        Step {
            line: 1,
            instruction: Instruction::Workdir { path: s("/a\n\"b\\") }
        }
        .cache_text(),
        "WORKDIR \"/a\\u{a}\\\"b\\\\\""
    );
}

#[test]
fn image_config_applies_steps_in_order() {
    let base = ImageConfig {
        env: strings(&["PATH=/usr/bin", "LANG=C"]),
        working_dir: None,
        user: None,
        exposed_ports: strings(&["80/tcp"]),
        entrypoint: None,
        cmd: Some(strings(&["sh"])),
    };
    let r = parse(
        "FROM a\nENV PATH=/opt/bin:/usr/bin NEW=1\nWORKDIR /srv\nUSER app\nEXPOSE 80 443\nENTRYPOINT [\"/init\"]\nLABEL x=y\nRUN true\nCOPY a /b\n",
    );
    let c = r.image_config(&base);
    assert_eq!(c.env, strings(&["PATH=/opt/bin:/usr/bin", "LANG=C", "NEW=1"]));
    assert_eq!(c.working_dir.as_deref(), Some("/srv"));
    assert_eq!(c.user.as_deref(), Some("app"));
    assert_eq!(c.exposed_ports, strings(&["80/tcp", "443/tcp"]));
    assert_eq!(c.entrypoint, Some(strings(&["/init"])));
    // The ENTRYPOINT reset the base image's CMD.
    assert_eq!(c.cmd, None);

    // A CMD after the ENTRYPOINT keeps it; the shell form runs /bin/sh -c.
    let r = parse("FROM a\nENTRYPOINT [\"/init\"]\nCMD serve now\n");
    let c = r.image_config(&base);
    assert_eq!(c.entrypoint, Some(strings(&["/init"])));
    assert_eq!(c.cmd, Some(strings(&["/bin/sh", "-c", "serve now"])));
    assert_eq!(
        c.start_command(),
        Some(strings(&["/init", "/bin/sh", "-c", "serve now"]))
    );

    // A CMD set by the recipe before an ENTRYPOINT stays (as docker).
    let r = parse("FROM a\nCMD [\"serve\"]\nENTRYPOINT /init\n");
    let c = r.image_config(&base);
    assert_eq!(c.entrypoint, Some(strings(&["/bin/sh", "-c", "/init"])));
    assert_eq!(c.cmd, Some(strings(&["serve"])));

    // Later steps override earlier ones; a recipe with no config steps keeps the base.
    let r =
        parse("FROM a\nWORKDIR /one\nUSER a\nENV A=1\nWORKDIR two\nUSER b\nENV A=2\nCMD [\"x\"]\nCMD []\n");
    let c = r.image_config(&ImageConfig::default());
    assert_eq!(c.working_dir.as_deref(), Some("/one/two"));
    assert_eq!(c.user.as_deref(), Some("b"));
    assert_eq!(c.env, strings(&["A=2"]));
    assert_eq!(c.cmd, Some(vec![]));
    assert_eq!(parse("FROM a\nRUN x\n").image_config(&base), base);
}

#[test]
fn serde_round_trip() {
    let r = parse_with(
        "FROM a\nARG V=1\nRUN make\nRUN [\"x\"]\nENV A=1\nWORKDIR /w\nUSER u\nLABEL l=v\nEXPOSE 1\nCMD c\nENTRYPOINT [\"e\"]\nCOPY --chown=u a /b\nADD a /c/\n",
        &[],
    );
    let json = serde_json::to_string(&r).expect("serialize");
    assert_eq!(serde_json::from_str::<Recipe>(&json).expect("deserialize"), r);
    let value = serde_json::to_value(&r.steps[0]).expect("serialize");
    assert_eq!(
        value,
        serde_json::json!({"line": 3, "instruction": {"kind": "run", "command": {"shell": "make"}, "arg_env": [["V", "1"]]}})
    );
    let value = serde_json::to_value(&r.steps[1].instruction).expect("serialize");
    assert_eq!(
        value,
        serde_json::json!({"kind": "run", "command": {"exec": ["x"]}, "arg_env": [["V", "1"]]})
    );
    let value = serde_json::to_value(&r.steps[10].instruction).expect("serialize");
    assert_eq!(
        value,
        serde_json::json!({"kind": "add", "sources": ["a"], "dest": "/c/"})
    );
    assert!(serde_json::from_str::<Instruction>(r#"{"kind":"volume","path":"/x"}"#).is_err());
    assert!(serde_json::from_str::<Instruction>(r#"{"kind":"user","user":"u","extra":1}"#).is_err());
}

#[test]
fn error_display() {
    let e = refuse("FROM a\n\nVOLUME /x\n");
    assert_eq!(
        e.to_string(),
        "line 3: VOLUME is not supported (a sandbox's volumes are given when it is created)"
    );
}

/// Recipe-like text: lines from a vocabulary of keywords and argument fragments, so that the
/// parser's deeper paths (substitution, quotes, continuations, flags) are reached.
fn recipe_text() -> impl Strategy<Value = String> {
    let keyword = prop::sample::select(vec![
        "FROM ",
        "ARG ",
        "RUN ",
        "ENV ",
        "WORKDIR ",
        "USER ",
        "LABEL ",
        "EXPOSE ",
        "CMD ",
        "ENTRYPOINT ",
        "COPY ",
        "ADD ",
        "VOLUME ",
        "# escape=",
        "# ",
        "",
    ]);
    let fragment = prop::sample::select(vec![
        "a",
        "A=1",
        "B",
        "$A",
        "${A}",
        "${A:-x}",
        "${A:+y}",
        "${",
        "}",
        "\"",
        "'",
        "\\",
        "\\\n",
        "=",
        " ",
        "  ",
        "[\"x\"]",
        "[",
        "]",
        "/",
        "..",
        "./",
        "--chown=u",
        "--from=x",
        "80",
        "80/udp",
        "0",
        "AS",
        "scratch",
        "\n",
        "#",
        "\t",
        "é",
        "\r\n",
    ]);
    let line =
        (keyword, prop::collection::vec(fragment, 0..8)).prop_map(|(k, f)| format!("{k}{}\n", f.concat()));
    // Half start with a valid FROM, so that the instructions after it are reached.
    (any::<bool>(), prop::collection::vec(line, 0..12))
        .prop_map(|(from, lines)| format!("{}{}", if from { "FROM alpine\n" } else { "" }, lines.concat()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any text is either parsed or refused with a line inside it; never a panic.
    #[test]
    fn never_panics_on_arbitrary_text(text in any::<String>()) {
        if let Err(e) = parse_recipe(&text, &no_args()) {
            prop_assert!(e.line >= 1 && e.line <= text.split('\n').count().max(1));
        }
    }

    /// Recipe-like text: parsed or refused; a parsed recipe's steps serialise and come back, and
    /// its lines are in order.
    #[test]
    fn never_panics_on_recipe_like_text(text in recipe_text()) {
        match parse_recipe(&text, &no_args()) {
            Ok(r) => {
                prop_assert!(r.steps.windows(2).all(|w| w[0].line < w[1].line));
                let json = serde_json::to_string(&r).expect("serialize");
                prop_assert_eq!(serde_json::from_str::<Recipe>(&json).expect("deserialize"), r.clone());
                let _ = r.image_config(&ImageConfig::default());
                for step in &r.steps {
                    let _ = step.cache_text();
                }
            }
            Err(e) => prop_assert!(e.line >= 1 && e.line <= text.split('\n').count().max(1)),
        }
    }
}
