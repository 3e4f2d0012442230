//! Values written the human way in the configuration file: sizes (`512M`), durations (`5m`) and
//! root file systems (`host` or a directory).

use super::*;

/// A size written as `512M` in the file (a number of bytes is accepted too).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Size(pub(crate) ByteSize);

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ByteSize::deserialize(d).map(Size)
    }
}

/// A duration written as humantime does (`5m`, `24h`, `7days`); a number means seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Human(pub(crate) Duration);

impl Serialize for Human {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

impl<'de> Deserialize<'de> for Human {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Human;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"30s\", \"5m\" or \"24h\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Human, E> {
                crate::cli::parse_human_duration(v).map(Human).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Human, E> {
                match u64::try_from(v) {
                    Ok(secs) if secs > 0 => Ok(Human(Duration::from_secs(secs))),
                    _ => Err(E::custom(format!("invalid duration {v}: must be positive"))),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Human, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Serde of a `Duration` field written as [`Human`] (`#[serde(with = "super::human_duration")]`).
pub(crate) mod human_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Human;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        Human(*d).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Human::deserialize(d).map(|h| h.0)
    }
}

/// A template's root file system: `"host"` or an absolute directory.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rootfs(pub(crate) RootfsSpec);

impl Serialize for Rootfs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            RootfsSpec::Host => s.serialize_str("host"),
            RootfsSpec::Dir { path } => s.serialize_str(&path.to_string_lossy()),
            // Never configured: image templates are built through the API.
            RootfsSpec::Image { template } => Err(serde::ser::Error::custom(format!(
                "template {template} is built from an image, not configured"
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for Rootfs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "host" {
            return Ok(Rootfs(RootfsSpec::Host));
        }
        let path = PathBuf::from(&text);
        if !path.is_absolute() {
            return Err(serde::de::Error::custom(format!(
                "invalid rootfs {text:?}: use \"host\" or an absolute directory"
            )));
        }
        Ok(Rootfs(RootfsSpec::Dir { path }))
    }
}
