//! serde_json's pretty layout (two spaces, `": "`, empty arrays and objects as `[]` and
//! `{}`), written with one write per line break instead of one per indentation level:
//! `queue --json` of 10,000 jobs is 10 MB of about 450,000 such lines.

use std::io::{self, Write};

use serde_json::ser::Formatter;

/// A line break and the deepest indentation written in one piece; deeper levels add
/// the rest two spaces at a time.
const BREAK: &[u8] = b",\n                                                                ";

#[derive(Default)]
pub struct Pretty {
    level: usize,
    has_value: bool,
}

impl Pretty {
    /// `,` (unless first), a line break and the current indentation.
    fn new_line<W: ?Sized + Write>(&self, w: &mut W, first: bool) -> io::Result<()> {
        let from = usize::from(first);
        let spaces = 2 * self.level;
        let end = (2 + spaces).min(BREAK.len());
        w.write_all(&BREAK[from..end])?;
        for _ in 0..(2 + spaces - end) / 2 {
            w.write_all(b"  ")?;
        }
        Ok(())
    }

    fn open<W: ?Sized + Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.new_line(w, true)?;
        }
        w.write_all(bracket)
    }
}

impl Formatter for Pretty {
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.new_line(w, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.new_line(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// How `--json` output is laid out: pretty for a person at a terminal, compact (one
/// line, no spaces: fewer bytes, faster to write and to read; docs/benchmarks.md) for
/// a pipe or a file, as `gh` does. `GPUCTL_JSON=pretty` or `compact` chooses
/// either way whatever stdout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Pretty,
    Compact,
}

impl Layout {
    /// The layout for this process's stdout.
    pub fn for_stdout() -> Layout {
        use std::io::IsTerminal;
        match std::env::var("GPUCTL_JSON").as_deref() {
            Ok("pretty") => Layout::Pretty,
            Ok("compact") => Layout::Compact,
            _ if std::io::stdout().is_terminal() => Layout::Pretty,
            _ => Layout::Compact,
        }
    }
}

/// `value` as JSON into `w`: `Layout::Pretty` as `serde_json::to_writer_pretty`
/// writes it, `Layout::Compact` as `serde_json::to_writer` does.
pub fn to_writer<W: Write, T: ?Sized + serde::Serialize>(
    w: W,
    value: &T,
    layout: Layout,
) -> serde_json::Result<()> {
    match layout {
        Layout::Pretty => {
            let mut ser = serde_json::Serializer::with_formatter(w, Pretty::default());
            value.serialize(&mut ser)
        }
        Layout::Compact => serde_json::to_writer(w, value),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// The same bytes as serde_json's own pretty printer, nesting deeper than one
    /// write of indentation covers included.
    #[test]
    fn writes_what_serde_json_writes() {
        let mut deep = json!({"leaf": [1, {}, [], "x\n\"y\""]});
        for i in 0..40 {
            deep = json!({ format!("k{i}"): deep, "empty": {}, "list": [i, null, true] });
        }
        for v in [
            json!([]),
            json!({}),
            json!(1),
            json!([[]]),
            json!([{}, {"a": []}]),
            deep,
        ] {
            let mut ours = Vec::new();
            super::to_writer(&mut ours, &v, super::Layout::Pretty).unwrap();
            let theirs = serde_json::to_vec_pretty(&v).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                String::from_utf8(theirs).unwrap()
            );
        }
    }
}
