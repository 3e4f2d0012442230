//! Signal names and numbers as API requests give them.

use crate::ServiceError;

const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc_sig::HUP),
    ("INT", libc_sig::INT),
    ("QUIT", libc_sig::QUIT),
    ("ABRT", libc_sig::ABRT),
    ("KILL", libc_sig::KILL),
    ("USR1", libc_sig::USR1),
    ("USR2", libc_sig::USR2),
    ("PIPE", libc_sig::PIPE),
    ("ALRM", libc_sig::ALRM),
    ("TERM", libc_sig::TERM),
    ("CONT", libc_sig::CONT),
    ("STOP", libc_sig::STOP),
    ("TSTP", libc_sig::TSTP),
    ("WINCH", libc_sig::WINCH),
];

/// Linux signal numbers (x86_64 and aarch64 agree on these).
mod libc_sig {
    pub const HUP: i32 = 1;
    pub const INT: i32 = 2;
    pub const QUIT: i32 = 3;
    pub const ABRT: i32 = 6;
    pub const KILL: i32 = 9;
    pub const USR1: i32 = 10;
    pub const USR2: i32 = 12;
    pub const PIPE: i32 = 13;
    pub const ALRM: i32 = 14;
    pub const TERM: i32 = 15;
    pub const CONT: i32 = 18;
    pub const STOP: i32 = 19;
    pub const TSTP: i32 = 20;
    pub const WINCH: i32 = 28;
}

/// Parses `TERM`, `SIGTERM`, `sigterm`, `15` or the JSON number 15.
pub(crate) fn parse_signal(field: &str, value: &serde_json::Value) -> Result<i32, ServiceError> {
    let bad = || {
        ServiceError::invalid(
            field,
            format!("{value} is not a signal (use a name like TERM or a number 1-64)"),
        )
    };
    let n = match value {
        serde_json::Value::Number(n) => n.as_i64().ok_or_else(bad)?,
        serde_json::Value::String(s) => {
            let upper = s.trim().to_ascii_uppercase();
            let name = upper.strip_prefix("SIG").unwrap_or(&upper);
            match SIGNALS.iter().find(|(n, _)| *n == name) {
                Some((_, num)) => i64::from(*num),
                None => name.parse::<i64>().map_err(|_| bad())?,
            }
        }
        _ => return Err(bad()),
    };
    if (1..=64).contains(&n) {
        Ok(n as i32)
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_and_numbers() {
        assert_eq!(parse_signal("s", &json!("TERM")).ok(), Some(15));
        assert_eq!(parse_signal("s", &json!("sigkill")).ok(), Some(9));
        assert_eq!(parse_signal("s", &json!(2)).ok(), Some(2));
        assert_eq!(parse_signal("s", &json!("10")).ok(), Some(10));
        for bad in [
            json!("NOPE"),
            json!(0),
            json!(65),
            json!(-1),
            json!(null),
            json!(""),
        ] {
            let e = parse_signal("signal", &bad).expect_err("refused");
            assert_eq!(e.field.as_deref(), Some("signal"));
        }
    }
}
