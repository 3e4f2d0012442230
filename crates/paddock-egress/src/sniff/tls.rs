//! The server name (SNI) of a TLS ClientHello.
//!
//! Records are reassembled here (a ClientHello with large post-quantum key shares may span several
//! records or TCP segments); the handshake message and its extensions are parsed by `tls-parser`.

use paddock_types::DomainName;
use tls_parser::{
    parse_tls_client_hello_extensions, parse_tls_message_handshake, SNIType, TlsExtension, TlsMessage,
    TlsMessageHandshake,
};

use super::Progress;

const RECORD_HEADER: usize = 5;
const CONTENT_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const MAX_RECORD: usize = 1 << 14;

/// Whether `first` can start a TLS connection.
pub(super) fn looks_like_tls(first: u8) -> bool {
    first == CONTENT_HANDSHAKE
}

/// The SNI of the ClientHello at the start of `buf`: `Done(None)` for a ClientHello without one.
pub(super) fn client_hello_sni(buf: &[u8]) -> Progress<Option<DomainName>> {
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < RECORD_HEADER {
            return Progress::NeedMore;
        }
        if rest[0] != CONTENT_HANDSHAKE {
            return Progress::Malformed("TLS record is not a handshake");
        }
        if rest[1] != 3 {
            return Progress::Malformed("not a TLS record version");
        }
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if len == 0 || len > MAX_RECORD {
            return Progress::Malformed("TLS record length out of range");
        }
        let Some(fragment) = rest.get(RECORD_HEADER..RECORD_HEADER + len) else {
            return Progress::NeedMore;
        };
        handshake.extend_from_slice(fragment);
        rest = &rest[RECORD_HEADER + len..];
        if handshake[0] != HANDSHAKE_CLIENT_HELLO {
            return Progress::Malformed("first handshake message is not a ClientHello");
        }
        if handshake.len() < 4 {
            continue;
        }
        let msg_len =
            usize::from(handshake[1]) << 16 | usize::from(handshake[2]) << 8 | usize::from(handshake[3]);
        if handshake.len() >= 4 + msg_len {
            return sni_of(&handshake[..4 + msg_len]);
        }
    }
}

fn sni_of(message: &[u8]) -> Progress<Option<DomainName>> {
    let Ok((_, TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello)))) =
        parse_tls_message_handshake(message)
    else {
        return Progress::Malformed("unparsable ClientHello");
    };
    let Some(ext) = hello.ext else {
        return Progress::Done(None);
    };
    let Ok((_, extensions)) = parse_tls_client_hello_extensions(ext) else {
        return Progress::Malformed("unparsable ClientHello extensions");
    };
    let mut names = extensions.iter().filter_map(|e| match e {
        TlsExtension::SNI(list) => Some(list),
        _ => None,
    });
    let Some(list) = names.next() else {
        return Progress::Done(None);
    };
    if names.next().is_some() {
        return Progress::Malformed("two server_name extensions");
    }
    let mut hosts = list.iter().filter(|(t, _)| *t == SNIType::HostName);
    let (Some((_, host)), None) = (hosts.next(), hosts.next()) else {
        return Progress::Malformed("server_name must hold exactly one host name");
    };
    match std::str::from_utf8(host)
        .ok()
        .and_then(|h| h.parse::<DomainName>().ok())
    {
        Some(name) => Progress::Done(Some(name)),
        None => Progress::Malformed("server name is not a valid domain name"),
    }
}
