//! The tree blob as a reader parses it, before it is checked and its runs expanded
//! (`Tree::from_parts`), entry by entry.

use serde::Deserialize;

/// One entry as it is parsed: flat, with the fields of every kind optional, so the parse of a
/// million entries buffers nothing (an internally tagged enum would buffer each entry first);
/// [`RawEntry::kind`] then requires the fields its type has.
#[derive(Deserialize)]
pub(super) struct RawEntry {
    pub path: String,
    #[serde(rename = "type")]
    kind: RawType,
    mode: Option<u32>,
    size: Option<u64>,
    chunks: Option<Vec<Span>>,
    target: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawType {
    File,
    Dir,
    Symlink,
}

pub(super) enum RawKind {
    File {
        mode: u32,
        size: u64,
        chunks: Vec<Span>,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: String,
    },
}

impl RawEntry {
    /// The entry's kind with the fields it must have, or what it lacks.
    pub fn kind(&mut self) -> Result<RawKind, String> {
        let missing = |field: &str| format!("entry {:?}: missing field `{field}`", self.path);
        Ok(match self.kind {
            RawType::File => RawKind::File {
                mode: self.mode.ok_or_else(|| missing("mode"))?,
                size: self.size.ok_or_else(|| missing("size"))?,
                chunks: self.chunks.take().ok_or_else(|| missing("chunks"))?,
            },
            RawType::Dir => RawKind::Dir {
                mode: self.mode.ok_or_else(|| missing("mode"))?,
            },
            RawType::Symlink => RawKind::Symlink {
                target: self.target.take().ok_or_else(|| missing("target"))?,
            },
        })
    }
}

/// One element of a file's `chunks`: a chunk index, or `[first, count]` for `count` consecutive ones.
pub(super) enum Span {
    One(u32),
    Run(u32, u32),
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Span, D::Error> {
        use serde::de::{Error, IgnoredAny, SeqAccess, Unexpected, Visitor};
        struct SpanVisitor;
        impl<'de> Visitor<'de> for SpanVisitor {
            type Value = Span;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a chunk index or [first, count]")
            }
            fn visit_u64<E: Error>(self, v: u64) -> Result<Span, E> {
                u32::try_from(v)
                    .map(Span::One)
                    .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &self))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Span, A::Error> {
                let first = seq
                    .next_element::<u32>()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let count = seq
                    .next_element::<u32>()?
                    .ok_or_else(|| A::Error::invalid_length(1, &self))?;
                if seq.next_element::<IgnoredAny>()?.is_some() {
                    return Err(A::Error::invalid_length(3, &self));
                }
                Ok(Span::Run(first, count))
            }
        }
        d.deserialize_any(SpanVisitor)
    }
}
