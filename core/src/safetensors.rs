//! Tensor-aware segmentation of safetensors files, so chunk boundaries fall on tensor boundaries.
//!
//! A safetensors file is an 8-byte little-endian header length `N`, `N` bytes of JSON mapping tensor
//! names to `data_offsets` (relative to byte `8 + N`), then the tensors end to end. Fine-tuning
//! rewrites some tensors and leaves others byte-identical, so the file is cut into *segments* first:
//! the header, each large tensor on its own, and runs of small tensors grouped together. Segments are
//! then chunked independently, so an unchanged tensor yields the same chunks wherever it moved.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::Algorithm;

/// Tensors at least this large are segments of their own (and content-defined cuts apply inside).
pub const SMALL_TENSOR: u64 = 64 * 1024;
/// A group of small tensors may close once it holds this much, at a content-defined point.
pub const GROUP_MIN: u64 = 16 * 1024;
/// A group of small tensors always closes once it holds this much.
pub const GROUP_MAX: u64 = 128 * 1024;
/// Headers larger than this are not trusted as safetensors (the format's own limit is 100 MB).
pub const MAX_HEADER: u64 = 100_000_000;

/// How a segment becomes chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    /// Content-defined chunking inside the segment.
    Cdc,
    /// The whole segment is one chunk (a group of small tensors).
    Single,
}

/// A byte range `[start, end)` of a file that is chunked on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub start: u64,
    pub end: u64,
    pub kind: SegmentKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SafetensorsError {
    #[error("file too short for a safetensors header")]
    TooShort,
    #[error("safetensors header of {0} bytes is implausible")]
    HeaderSize(u64),
    #[error("safetensors header is not valid JSON: {0}")]
    Json(String),
    #[error("tensor {0:?} has offsets outside the file or reversed")]
    BadOffsets(String),
    #[error("tensors {0:?} and {1:?} overlap")]
    Overlap(String, String),
}

/// The header length from the first 8 bytes, checked against the file size.
pub fn header_len(first8: &[u8], file_size: u64) -> Result<u64, SafetensorsError> {
    let bytes: [u8; 8] = first8
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(SafetensorsError::TooShort)?;
    let n = u64::from_le_bytes(bytes);
    if !(2..=MAX_HEADER).contains(&n) || 8 + n > file_size {
        return Err(SafetensorsError::HeaderSize(n));
    }
    Ok(n)
}

#[derive(Deserialize)]
struct TensorInfo {
    data_offsets: (u64, u64),
}

/// A tensor's name and absolute byte range in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpan {
    pub name: String,
    pub start: u64,
    pub end: u64,
}

/// Parses the JSON header (the `N` bytes after the length) into tensors sorted by position.
pub fn parse_header(json: &[u8], file_size: u64) -> Result<Vec<TensorSpan>, SafetensorsError> {
    let data_start = 8 + json.len() as u64;
    let map: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| SafetensorsError::Json(e.to_string()))?;
    let mut tensors = Vec::with_capacity(map.len());
    for (name, value) in map {
        if name == "__metadata__" {
            continue;
        }
        let info: TensorInfo =
            serde_json::from_value(value).map_err(|e| SafetensorsError::Json(e.to_string()))?;
        let (b, e) = info.data_offsets;
        let (start, end) = (data_start.checked_add(b), data_start.checked_add(e));
        match (start, end) {
            (Some(start), Some(end)) if start <= end && end <= file_size => {
                tensors.push(TensorSpan { name, start, end })
            }
            _ => return Err(SafetensorsError::BadOffsets(name)),
        }
    }
    tensors.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    for pair in tensors.windows(2) {
        if pair[1].start < pair[0].end {
            return Err(SafetensorsError::Overlap(
                pair[0].name.clone(),
                pair[1].name.clone(),
            ));
        }
    }
    Ok(tensors)
}

/// Whether a group of small tensors may close after the tensor `name`: a property of the name, so
/// adding or removing a tensor only disturbs the groups next to it.
fn is_group_boundary(name: &str) -> bool {
    // One name in four: the first hex digit of its sha256 is 0-3.
    let d = Algorithm::Sha256.digest_bytes(name.as_bytes());
    matches!(d.hex().as_bytes().first(), Some(b'0'..=b'3'))
}

/// Cuts a safetensors file into segments: the header (with its length prefix), then tensors.
///
/// Bytes between tensors (alignment padding) and after the last one belong to the segment before
/// them, so the segments always cover the whole file exactly.
pub fn plan_segments(file_size: u64, header_end: u64, tensors: &[TensorSpan]) -> Vec<Segment> {
    let mut segments = vec![Segment {
        start: 0,
        end: header_end,
        kind: SegmentKind::Cdc,
    }];
    let mut group: Option<(u64, u64)> = None;
    let close = |segments: &mut Vec<Segment>, group: &mut Option<(u64, u64)>| {
        if let Some((start, end)) = group.take() {
            segments.push(Segment {
                start,
                end,
                kind: SegmentKind::Single,
            });
        }
    };
    for t in tensors.iter().filter(|t| t.end > t.start) {
        // Padding before this tensor joins whatever came before it.
        match &mut group {
            Some((_, end)) => *end = t.start,
            None => {
                if let Some(last) = segments.last_mut() {
                    last.end = t.start;
                }
            }
        }
        let len = t.end - t.start;
        if len >= SMALL_TENSOR {
            close(&mut segments, &mut group);
            segments.push(Segment {
                start: t.start,
                end: t.end,
                kind: SegmentKind::Cdc,
            });
            continue;
        }
        let (start, _) = group.unwrap_or((t.start, t.start));
        group = Some((start, t.end));
        let size = t.end - start;
        if size >= GROUP_MAX || (size >= GROUP_MIN && is_group_boundary(&t.name)) {
            close(&mut segments, &mut group);
        }
    }
    close(&mut segments, &mut group);
    if let Some(last) = segments.last_mut() {
        last.end = file_size;
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(name: &str, start: u64, end: u64) -> TensorSpan {
        TensorSpan {
            name: name.into(),
            start,
            end,
        }
    }

    #[test]
    fn header_is_parsed_and_sorted_by_offset() {
        let json = br#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
        let t = parse_header(json, 8 + json.len() as u64 + 8).unwrap();
        let base = 8 + json.len() as u64;
        assert_eq!(
            t,
            vec![span("a", base, base + 4), span("b", base + 4, base + 8)]
        );
    }

    #[test]
    fn hostile_headers_are_rejected() {
        assert!(header_len(&[0; 4], 100).is_err());
        assert!(header_len(&u64::MAX.to_le_bytes(), 100).is_err());
        assert!(parse_header(b"[1,2]", 100).is_err());
        assert!(parse_header(br#"{"a":{"data_offsets":[8,4]}}"#, 100).is_err());
        assert!(parse_header(br#"{"a":{"data_offsets":[0,1000]}}"#, 100).is_err());
        assert!(parse_header(
            br#"{"a":{"data_offsets":[0,8]},"b":{"data_offsets":[4,12]}}"#,
            100
        )
        .is_err());
        assert!(parse_header(
            br#"{"a":{"data_offsets":[18446744073709551615,18446744073709551615]}}"#,
            100
        )
        .is_err());
    }

    #[test]
    fn segments_cover_the_file_exactly_with_large_tensors_alone() {
        let big = SMALL_TENSOR * 4;
        let tensors = vec![
            span("emb", 100, 100 + big),
            span("n1", 100 + big, 100 + big + 1536),
            span("n2", 100 + big + 1536, 100 + big + 3072),
            span("w", 100 + big + 4096, 100 + 2 * big + 4096),
        ];
        let size = 100 + 2 * big + 4096 + 10;
        let s = plan_segments(size, 100, &tensors);
        assert_eq!(
            s[0],
            Segment {
                start: 0,
                end: 100,
                kind: SegmentKind::Cdc
            }
        );
        assert_eq!(
            s[1],
            Segment {
                start: 100,
                end: 100 + big,
                kind: SegmentKind::Cdc
            }
        );
        // The two small tensors form one group, taking the padding before `w`.
        assert_eq!(s[2].kind, SegmentKind::Single);
        assert_eq!((s[2].start, s[2].end), (100 + big, 100 + big + 4096));
        assert_eq!(
            s[3],
            Segment {
                start: 100 + big + 4096,
                end: size,
                kind: SegmentKind::Cdc
            }
        );
        for w in s.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
    }

    #[test]
    fn small_tensor_groups_are_bounded() {
        let tensors: Vec<_> = (0..200u64)
            .map(|i| {
                span(
                    &format!("layer.{i}.norm"),
                    1000 + i * 1536,
                    1000 + (i + 1) * 1536,
                )
            })
            .collect();
        let s = plan_segments(1000 + 200 * 1536, 1000, &tensors);
        assert!(
            s.len() > 3,
            "small tensors must not collapse into one segment"
        );
        for seg in &s[1..] {
            assert!(seg.end - seg.start < GROUP_MAX + SMALL_TENSOR);
        }
    }
}
