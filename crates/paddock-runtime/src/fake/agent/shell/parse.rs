//! The interpreter's language: words (with `'...'`, `"..."`, `\` escapes and `$NAME`, `${NAME}`,
//! `$?` expansions), commands joined by `;`, newlines, `&&` and `||`, and the redirections `>`,
//! `>>`, `<`, `2>`, `2>>`, `>&2` (`1>&2`) and `2>&1`.
//!
//! Not part of it (refused as a syntax error or, for keywords, run as unknown commands): pipelines,
//! background jobs, command substitution, globbing, variable assignment, `if`/`while`/`for`,
//! functions and subshells. An unquoted expansion is not split into several words.

/// One piece of a word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Lit(String),
    /// A variable to expand (`?` is the last status).
    Var(String),
}

/// A word before expansion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Word {
    pub(crate) parts: Vec<Part>,
    /// It had quotes, so it stays a word even if it expands to nothing.
    pub(crate) quoted: bool,
}

/// A redirection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// `>` and `1>`.
    Out,
    /// `>>`.
    Append,
    /// `<`.
    In,
    /// `2>`.
    ErrOut,
    /// `2>>`.
    ErrAppend,
    /// `>&2`, `1>&2`.
    OutToErr,
    /// `2>&1`.
    ErrToOut,
}

impl Redirect {
    fn takes_target(self) -> bool {
        !matches!(self, Self::OutToErr | Self::ErrToOut)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Word(Word),
    Semi,
    And,
    Or,
    Pipe,
    Amp,
    Redirect(Redirect),
}

/// When a command runs, given the previous command's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Connector {
    Always,
    /// `&&`: after a success.
    And,
    /// `||`: after a failure.
    Or,
}

/// One simple command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Command {
    pub(crate) words: Vec<Word>,
    pub(crate) redirects: Vec<(Redirect, Option<Word>)>,
}

/// Parses a script into its commands.
pub(crate) fn parse(script: &str) -> Result<Vec<(Connector, Command)>, String> {
    let mut out = Vec::new();
    let mut connector = Connector::Always;
    let mut current = Command::default();
    let mut awaiting: Option<Redirect> = None;
    let finish = |current: &mut Command, connector: Connector, out: &mut Vec<(Connector, Command)>| {
        if !current.words.is_empty() || !current.redirects.is_empty() {
            out.push((connector, std::mem::take(current)));
            true
        } else {
            false
        }
    };
    for token in lex(script)? {
        if let Some(redirect) = awaiting.take() {
            match token {
                Token::Word(word) => {
                    current.redirects.push((redirect, Some(word)));
                    continue;
                }
                _ => return Err("Syntax error: redirection without a file name".into()),
            }
        }
        match token {
            Token::Word(word) => current.words.push(word),
            Token::Semi => {
                finish(&mut current, connector, &mut out);
                connector = Connector::Always;
            }
            Token::And | Token::Or => {
                if !finish(&mut current, connector, &mut out) {
                    return Err("Syntax error: \"&&\" or \"||\" unexpected".into());
                }
                connector = if token == Token::And {
                    Connector::And
                } else {
                    Connector::Or
                };
            }
            Token::Pipe | Token::Amp => {
                return Err(
                    "pipelines (|) and background jobs (&) are not supported by the fake agent".into(),
                )
            }
            Token::Redirect(r) if r.takes_target() => awaiting = Some(r),
            Token::Redirect(r) => current.redirects.push((r, None)),
        }
    }
    if awaiting.is_some() {
        return Err("Syntax error: redirection without a file name".into());
    }
    if !finish(&mut current, connector, &mut out) && connector != Connector::Always {
        return Err("Syntax error: end of file unexpected".into());
    }
    Ok(out)
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
    tokens: Vec<Token>,
    word: Option<Word>,
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn word(&mut self) -> &mut Word {
        self.word.get_or_insert_with(Word::default)
    }

    fn push_char(&mut self, c: char) {
        let word = self.word();
        match word.parts.last_mut() {
            Some(Part::Lit(s)) => s.push(c),
            _ => word.parts.push(Part::Lit(c.to_string())),
        }
    }

    fn flush(&mut self) {
        if let Some(word) = self.word.take() {
            self.tokens.push(Token::Word(word));
        }
    }

    /// After a `$`: a variable, or a literal `$`.
    fn dollar(&mut self) -> Result<(), String> {
        match self.peek(0) {
            Some('?') => {
                self.at += 1;
                self.word().parts.push(Part::Var("?".into()));
            }
            Some('{') => {
                let end = self.chars[self.at..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or("Syntax error: missing }")?;
                let name: String = self.chars[self.at + 1..self.at + end].iter().collect();
                self.at += end + 1;
                self.word().parts.push(Part::Var(name));
            }
            Some('(') => return Err("command substitution is not supported by the fake agent".into()),
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let mut name = String::new();
                while let Some(c) = self.peek(0).filter(|c| c.is_ascii_alphanumeric() || *c == '_') {
                    name.push(c);
                    self.at += 1;
                }
                self.word().parts.push(Part::Var(name));
            }
            _ => self.push_char('$'),
        }
        Ok(())
    }

    /// A `>` (its fd, if any, is the word just before it: `2>`).
    fn redirect_out(&mut self) -> Result<(), String> {
        let fd = match &self.word {
            Some(w) if !w.quoted && w.parts == [Part::Lit("2".into())] => 2,
            Some(w) if !w.quoted && w.parts == [Part::Lit("1".into())] => 1,
            _ => 0,
        };
        if fd == 0 {
            self.flush();
        } else {
            self.word = None;
        }
        self.at += 1;
        let append = self.peek(0) == Some('>');
        if append {
            self.at += 1;
        }
        let redirect = if !append && self.peek(0) == Some('&') {
            let target = self.peek(1);
            self.at += 2;
            match (fd, target) {
                (0 | 1, Some('2')) => Redirect::OutToErr,
                (2, Some('1')) => Redirect::ErrToOut,
                (2, Some('2')) | (0 | 1, Some('1')) => return Ok(()),
                _ => return Err("Syntax error: bad fd number".into()),
            }
        } else {
            match (fd, append) {
                (2, false) => Redirect::ErrOut,
                (2, true) => Redirect::ErrAppend,
                (_, false) => Redirect::Out,
                (_, true) => Redirect::Append,
            }
        };
        self.tokens.push(Token::Redirect(redirect));
        Ok(())
    }
}

fn lex(script: &str) -> Result<Vec<Token>, String> {
    let mut lx = Lexer {
        chars: script.chars().collect(),
        at: 0,
        tokens: Vec::new(),
        word: None,
    };
    while let Some(c) = lx.peek(0) {
        match c {
            ' ' | '\t' | '\r' => {
                lx.flush();
                lx.at += 1;
            }
            '\n' | ';' => {
                lx.flush();
                lx.tokens.push(Token::Semi);
                lx.at += 1;
            }
            '#' if lx.word.is_none() => {
                while lx.peek(0).is_some_and(|c| c != '\n') {
                    lx.at += 1;
                }
            }
            '&' | '|' => {
                lx.flush();
                let double = lx.peek(1) == Some(c);
                lx.at += if double { 2 } else { 1 };
                lx.tokens.push(match (c, double) {
                    ('&', true) => Token::And,
                    ('&', false) => Token::Amp,
                    ('|', true) => Token::Or,
                    _ => Token::Pipe,
                });
            }
            '>' => lx.redirect_out()?,
            '<' => {
                lx.flush();
                lx.at += 1;
                lx.tokens.push(Token::Redirect(Redirect::In));
            }
            '\'' => {
                let end = lx.chars[lx.at + 1..]
                    .iter()
                    .position(|&c| c == '\'')
                    .ok_or("Syntax error: unterminated quoted string")?;
                let text: String = lx.chars[lx.at + 1..lx.at + 1 + end].iter().collect();
                lx.at += end + 2;
                let word = lx.word();
                word.quoted = true;
                word.parts.push(Part::Lit(text));
            }
            '"' => {
                lx.word().quoted = true;
                lx.at += 1;
                loop {
                    match lx.peek(0) {
                        None => return Err("Syntax error: unterminated quoted string".into()),
                        Some('"') => {
                            lx.at += 1;
                            break;
                        }
                        Some('\\') if matches!(lx.peek(1), Some('"' | '\\' | '$' | '`')) => {
                            let escaped = lx.peek(1).unwrap_or('\\');
                            lx.push_char(escaped);
                            lx.at += 2;
                        }
                        Some('$') => {
                            lx.at += 1;
                            lx.dollar()?;
                        }
                        Some(c) => {
                            lx.push_char(c);
                            lx.at += 1;
                        }
                    }
                }
            }
            '\\' => {
                match lx.peek(1) {
                    Some('\n') => {}
                    Some(next) => lx.push_char(next),
                    None => lx.push_char('\\'),
                }
                lx.at += 2;
            }
            '$' => {
                lx.at += 1;
                lx.dollar()?;
            }
            '`' => return Err("command substitution is not supported by the fake agent".into()),
            c => {
                lx.push_char(c);
                lx.at += 1;
            }
        }
    }
    lx.flush();
    Ok(lx.tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lit(s: &str) -> Word {
        Word {
            parts: vec![Part::Lit(s.into())],
            quoted: false,
        }
    }

    #[test]
    fn commands_connectors_and_redirects() {
        let parsed = parse("echo a 'b c'; false || echo \"x $HOME\" >&2 && cat < f 2>>err").expect("parses");
        assert_eq!(parsed.len(), 4);
        assert_eq!(parsed[0].1.words[2].parts, [Part::Lit("b c".into())]);
        assert_eq!(parsed[2].0, Connector::Or);
        assert_eq!(
            parsed[2].1.words[1].parts,
            [Part::Lit("x ".into()), Part::Var("HOME".into())]
        );
        assert_eq!(parsed[2].1.redirects, [(Redirect::OutToErr, None)]);
        assert_eq!(parsed[3].0, Connector::And);
        assert_eq!(
            parsed[3].1.redirects,
            [
                (Redirect::In, Some(lit("f"))),
                (Redirect::ErrAppend, Some(lit("err")))
            ]
        );
    }

    #[test]
    fn refusals() {
        assert!(parse("a | b").is_err());
        assert!(parse("sleep 1 &").is_err());
        assert!(parse("echo $(id)").is_err());
        assert!(parse("echo 'open").is_err());
        assert!(parse("a &&").is_err());
        assert!(parse("echo >").is_err());
        assert_eq!(parse("# only a comment\n").expect("parses"), []);
        let escaped = parse("echo a\\ b 2>&1").expect("parses");
        assert_eq!(escaped[0].1.words[1], lit("a b"));
        assert_eq!(escaped[0].1.redirects, [(Redirect::ErrToOut, None)]);
    }
}
