//! serde helpers for protobuf's canonical JSON mapping of scalar fields, enums and
//! `google.protobuf.Timestamp` (used through `#[serde(with = ...)]` in the message structs).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// For `skip_serializing_if`: proto3 leaves fields with their default value out.
pub fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// An integer given as a JSON number (integral) or a decimal string, as protobuf's JSON parsers
/// accept for every integer type.
struct IntVisitor;

impl Visitor<'_> for IntVisitor {
    type Value = i128;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer (number or string)")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<i128, E> {
        Ok(i128::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<i128, E> {
        Ok(i128::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<i128, E> {
        if v.fract() == 0.0 && v.abs() < 1e19 {
            Ok(v as i128)
        } else {
            Err(E::custom(format!("{v} is not an integer")))
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<i128, E> {
        v.trim()
            .parse::<i128>()
            .map_err(|_| E::custom(format!("{v:?} is not an integer")))
    }
}

fn int_in<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<T, D::Error> {
    let v = d.deserialize_any(IntVisitor)?;
    T::try_from(v).map_err(|_| de::Error::custom(format!("{v} is out of range")))
}

/// `uint32`: a number out, a number or string in.
pub mod u32_num {
    use super::*;

    /// Serialize.
    pub fn serialize<S: Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(*v)
    }

    /// Deserialize.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
        int_in(d)
    }
}

/// `int32`/`sint32`: a number out, a number or string in.
pub mod i32_num {
    use super::*;

    /// Serialize.
    pub fn serialize<S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i32(*v)
    }

    /// Deserialize.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
        int_in(d)
    }
}

/// `int64`: a decimal string out, a number or string in.
pub mod i64_str {
    use super::*;

    /// Serialize.
    pub fn serialize<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    /// Deserialize.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        int_in(d)
    }
}

/// `bytes`: standard base64 with padding out; standard or URL-safe, padded or not, in.
pub mod b64 {
    use super::*;

    /// Serialize.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    /// Deserialize.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        decode(&text).ok_or_else(|| de::Error::custom("invalid base64"))
    }

    /// Any of the four alphabets/paddings protobuf's JSON parsers accept.
    pub fn decode(text: &str) -> Option<Vec<u8>> {
        use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
        [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
            .iter()
            .find_map(|engine| engine.decode(text).ok())
    }
}

/// A `oneof` (flattened into its message, as protobuf's JSON has it): absent is `None`, but a
/// member that is present and malformed is an error (serde's `Option` under `flatten` would read
/// it as absent).
pub fn oneof<'de, D: Deserializer<'de>, E: Deserialize<'de>>(d: D) -> Result<Option<E>, D::Error> {
    match E::deserialize(d) {
        Ok(e) => Ok(Some(e)),
        // What serde's flattened-map deserializer says when no member is there at all.
        Err(e) if e.to_string().starts_with("no variant of enum") => Ok(None),
        Err(e) => Err(e),
    }
}

/// A protobuf enum's names (prost's `as_str_name`/`from_str_name`, behind one trait).
pub trait ProtoEnum {
    /// The name of value `v`, if it is one of the enum's.
    fn name_of(v: i32) -> Option<&'static str>;
    /// The value named `name`.
    fn value_of(name: &str) -> Option<i32>;
}

/// An enum field: its name out (the number when it is not a known value), a name or number in.
pub fn enum_ser<E: ProtoEnum, S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
    match E::name_of(*v) {
        Some(name) => s.serialize_str(name),
        None => s.serialize_i32(*v),
    }
}

/// See [`enum_ser`].
pub fn enum_de<'de, E: ProtoEnum, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    struct EnumVisitor<E>(std::marker::PhantomData<E>);
    impl<E: ProtoEnum> Visitor<'_> for EnumVisitor<E> {
        type Value = i32;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an enum value name or number")
        }
        fn visit_str<Er: de::Error>(self, v: &str) -> Result<i32, Er> {
            E::value_of(v).ok_or_else(|| Er::custom(format!("unknown enum value {v:?}")))
        }
        fn visit_i64<Er: de::Error>(self, v: i64) -> Result<i32, Er> {
            i32::try_from(v).map_err(|_| Er::custom(format!("{v} is out of range")))
        }
        fn visit_u64<Er: de::Error>(self, v: u64) -> Result<i32, Er> {
            i32::try_from(v).map_err(|_| Er::custom(format!("{v} is out of range")))
        }
    }
    d.deserialize_any(EnumVisitor::<E>(std::marker::PhantomData))
}

/// Implements [`ProtoEnum`] for prost enumerations.
macro_rules! proto_enum {
    ($($t:ty),*) => {$(
        impl $crate::envd::proto::json::ProtoEnum for $t {
            fn name_of(v: i32) -> Option<&'static str> {
                <$t>::try_from(v).ok().map(|e| e.as_str_name())
            }
            fn value_of(name: &str) -> Option<i32> {
                <$t>::from_str_name(name).map(|e| e as i32)
            }
        }
    )*};
}
pub(crate) use proto_enum;

/// `google.protobuf.Timestamp`: seconds and nanoseconds since the Unix epoch; in JSON an RFC 3339
/// string in UTC with 0, 3, 6 or 9 fractional digits.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Timestamp {
    /// Seconds since the epoch.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// Nanoseconds within the second (0..1e9).
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl Timestamp {
    /// From Unix milliseconds.
    pub fn from_millis(ms: i64) -> Self {
        Self {
            seconds: ms.div_euclid(1000),
            nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
        }
    }

    /// Parses RFC 3339 in UTC (`...Z`); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let t = humantime::parse_rfc3339(text).ok()?;
        let d = t.duration_since(UNIX_EPOCH).ok()?;
        Some(Self {
            seconds: i64::try_from(d.as_secs()).ok()?,
            nanos: d.subsec_nanos() as i32,
        })
    }

    /// RFC 3339 in UTC (times before the epoch are written as the epoch).
    pub fn to_rfc3339(&self) -> String {
        let secs = u64::try_from(self.seconds).unwrap_or(0);
        let nanos = u32::try_from(self.nanos).unwrap_or(0).min(999_999_999);
        let t = SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
        if nanos == 0 {
            humantime::format_rfc3339_seconds(t).to_string()
        } else if nanos % 1_000_000 == 0 {
            humantime::format_rfc3339_millis(t).to_string()
        } else if nanos % 1_000 == 0 {
            humantime::format_rfc3339_micros(t).to_string()
        } else {
            humantime::format_rfc3339_nanos(t).to_string()
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).ok_or_else(|| de::Error::custom(format!("{text:?} is not an RFC 3339 time")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_in_rfc3339() {
        let t = Timestamp::from_millis(1_700_000_000_123);
        assert_eq!(t.to_rfc3339(), "2023-11-14T22:13:20.123Z");
        assert_eq!(Timestamp::parse("2023-11-14T22:13:20.123Z"), Some(t));
        assert_eq!(Timestamp::from_millis(0).to_rfc3339(), "1970-01-01T00:00:00Z");
        let micro = Timestamp {
            seconds: 1,
            nanos: 5_000,
        };
        assert_eq!(micro.to_rfc3339(), "1970-01-01T00:00:01.000005Z");
        assert_eq!(Timestamp::parse("not a time"), None);
    }

    #[test]
    fn base64_in_every_alphabet() {
        for text in ["/wA=", "/wA", "_wA=", "_wA"] {
            assert_eq!(b64::decode(text), Some(vec![0xff, 0x00]), "{text}");
        }
        assert_eq!(b64::decode("!!"), None);
    }
}
