//! Content codings of `/files`: which one a download is sent in (`Accept-Encoding`, envd's choice:
//! the acceptable coding of highest quality, gzip or identity), which one an upload came in
//! (`Content-Encoding`), and the gzip streams both ways.
//!
//! Both streams hold a bounded buffer whatever the data: a download is compressed as it is read
//! from the sandbox, an upload decompressed as the write takes it (so a small body that inflates to
//! gigabytes costs the host no more memory than any other, and stops at the sandbox's disk limit).
//! It does not offer deflate, br or zstd (envd offers gzip alone).

use async_compression::tokio::bufread::{GzipDecoder, GzipEncoder};
use async_compression::Level;
use futures_util::TryStreamExt as _;
use paddock_control::ByteStream;
use tokio_util::io::{ReaderStream, StreamReader};

/// Bytes read at a time from a coder (each chunk of its output stream is at most this long).
const CHUNK: usize = 64 * 1024;

/// A content coding paddock can read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// The bytes as they are.
    Identity,
    /// gzip.
    Gzip,
}

/// The request accepts neither identity nor gzip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotAcceptable;

/// The request's body is in a coding paddock cannot read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedCoding(pub String);

/// The coding to send a download in, from the `Accept-Encoding` header (its lines joined): the
/// acceptable one of highest quality; identity when nothing is said or nothing better is
/// acceptable, unless identity is refused (`identity;q=0`, or `*;q=0` with no identity entry).
pub fn accepted_coding(header: Option<&str>) -> Result<Coding, NotAcceptable> {
    let Some(header) = header.filter(|h| !h.trim().is_empty()) else {
        return Ok(Coding::Identity);
    };
    let mut entries: Vec<(String, f64)> = header.split(',').map(coding_with_quality).collect();
    // Stable: among equal qualities the client's order decides.
    entries.sort_by(|a, b| b.1.total_cmp(&a.1));
    let identity_refused = entries.iter().any(|(c, q)| c == "identity" && *q == 0.0);
    for (coding, quality) in &entries {
        if *quality == 0.0 {
            continue;
        }
        match coding.as_str() {
            "identity" => return Ok(Coding::Identity),
            "gzip" => return Ok(Coding::Gzip),
            "*" if identity_refused => return Ok(Coding::Gzip),
            "*" => return Ok(Coding::Identity),
            _ => {}
        }
    }
    if identity_refused {
        Err(NotAcceptable)
    } else {
        Ok(Coding::Identity)
    }
}

/// The coding of an upload's body, from its `Content-Encoding` header.
pub fn content_coding(header: Option<&str>) -> Result<Coding, UnsupportedCoding> {
    let Some(header) = header.filter(|h| !h.trim().is_empty()) else {
        return Ok(Coding::Identity);
    };
    match coding_with_quality(header).0.as_str() {
        "identity" => Ok(Coding::Identity),
        "gzip" | "x-gzip" => Ok(Coding::Gzip),
        _ => Err(UnsupportedCoding(header.to_owned())),
    }
}

/// `gzip;q=0.5` → (`gzip`, 0.5); a missing or unreadable quality is 1.
fn coding_with_quality(entry: &str) -> (String, f64) {
    let mut parts = entry.split(';');
    let coding = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let quality = parts
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case("q")
                .then(|| v.trim().parse::<f64>().ok())?
        })
        .next()
        .filter(|q| q.is_finite())
        .unwrap_or(1.0);
    (coding, quality)
}

/// `stream`, gzip-compressed as it is read (the fastest level: the host's CPU compresses every
/// download a client accepts gzip for, and httpx asks for it by default).
pub fn gzip_encode(stream: ByteStream) -> ByteStream {
    let encoder = GzipEncoder::with_quality(StreamReader::new(stream), Level::Fastest);
    Box::pin(ReaderStream::with_capacity(encoder, CHUNK))
}

/// `stream`, gzip-decompressed as it is read (concatenated members included, as Go's reader
/// reads them). A corrupt stream ends in an error naming it.
pub fn gzip_decode(stream: ByteStream) -> ByteStream {
    let mut decoder = GzipDecoder::new(StreamReader::new(stream));
    decoder.multiple_members(true);
    Box::pin(
        ReaderStream::with_capacity(decoder, CHUNK)
            .map_err(|e| std::io::Error::new(e.kind(), format!("the gzip body is corrupt: {e}"))),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt as _;

    #[test]
    fn accept_encoding_picks_envds_choice() {
        let pick = |h: &str| accepted_coding(Some(h));
        assert_eq!(accepted_coding(None), Ok(Coding::Identity));
        assert_eq!(pick(""), Ok(Coding::Identity));
        assert_eq!(pick("gzip"), Ok(Coding::Gzip));
        assert_eq!(pick("gzip, deflate"), Ok(Coding::Gzip));
        assert_eq!(pick("deflate, GZIP;q=0.5"), Ok(Coding::Gzip));
        assert_eq!(pick("identity, gzip"), Ok(Coding::Identity));
        assert_eq!(pick("gzip;q=0.1, identity;q=0.9"), Ok(Coding::Identity));
        assert_eq!(pick("br"), Ok(Coding::Identity));
        assert_eq!(pick("gzip;q=0"), Ok(Coding::Identity));
        assert_eq!(pick("*"), Ok(Coding::Identity));
        assert_eq!(pick("*, identity;q=0"), Ok(Coding::Gzip));
        assert_eq!(pick("br, identity;q=0"), Err(NotAcceptable));
        assert_eq!(pick("gzip;q=0, identity;q=0"), Err(NotAcceptable));
    }

    #[test]
    fn content_encoding_names_the_upload_coding() {
        assert_eq!(content_coding(None), Ok(Coding::Identity));
        assert_eq!(content_coding(Some("identity")), Ok(Coding::Identity));
        assert_eq!(content_coding(Some("GZip")), Ok(Coding::Gzip));
        assert_eq!(content_coding(Some("br")), Err(UnsupportedCoding("br".into())));
    }

    fn stream_of(chunks: Vec<Vec<u8>>) -> ByteStream {
        Box::pin(futures_util::stream::iter(
            chunks.into_iter().map(|c| Ok(bytes::Bytes::from(c))),
        ))
    }

    async fn collect(mut s: ByteStream) -> std::io::Result<(Vec<u8>, usize)> {
        let (mut out, mut largest) = (Vec::new(), 0);
        while let Some(chunk) = s.next().await {
            let chunk = chunk?;
            largest = largest.max(chunk.len());
            out.extend_from_slice(&chunk);
        }
        Ok((out, largest))
    }

    #[tokio::test]
    async fn gzip_round_trips_in_bounded_chunks() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let (packed, _) = collect(gzip_encode(stream_of(vec![
            data[..1000].to_vec(),
            data[1000..].to_vec(),
        ])))
        .await
        .expect("encodes");
        assert!(packed.len() < data.len());
        // Two members, as a client may send them.
        let mut twice = packed.clone();
        twice.extend_from_slice(&packed);
        let (plain, largest) = collect(gzip_decode(stream_of(vec![twice])))
            .await
            .expect("decodes");
        assert_eq!(plain.len(), 2 * data.len());
        assert_eq!(&plain[..data.len()], &data[..]);
        assert!(largest <= CHUNK);
        let corrupt = collect(gzip_decode(stream_of(vec![b"not gzip at all".to_vec()]))).await;
        assert!(corrupt.is_err());
    }
}
