//! `queue --json` of a large queue, in parallel: the controller's pages arrive as
//! undecoded bytes; two worker threads each decode a page and write its JSON while the
//! next pages arrive, and the writer prints the pieces in order. The output is, byte for
//! byte, what serializing the whole list at once gives in either layout
//! (`pretty::Layout`): an array is `[`, its elements' parts joined by `,`, then `\n]`
//! (pretty) or `]` (compact), and each page's part is what the page alone gives between
//! its own brackets.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use gpuctl_proto as pb;
use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};

use crate::format::JobJson;
use crate::pretty::Layout;

/// Threads that decode pages and write their JSON.
const WORKERS: usize = 2;

/// The codec of a listing whose answers are kept as bytes: the request is encoded as
/// usual, each page is handed over undecoded.
#[derive(Default)]
pub struct RawPages;

pub struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = bytes::Bytes;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<bytes::Bytes>, Status> {
        use bytes::Buf;
        Ok(Some(buf.copy_to_bytes(buf.remaining())))
    }
}

impl Codec for RawPages {
    type Encode = pb::ListJobsRequest;
    type Decode = bytes::Bytes;
    type Encoder = tonic_prost::ProstEncoder<pb::ListJobsRequest>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

/// One page's JSON: the whole array of its jobs, of which the writer prints the part
/// between the brackets (empty for an empty page).
pub fn page_json(jobs: &[pb::Job], layout: Layout) -> Vec<u8> {
    let mut out = Vec::with_capacity(jobs.len() * 1024 + 4);
    page_json_into(&mut out, jobs, layout);
    out
}

/// `page_json` into `out` (emptied first).
fn page_json_into(out: &mut Vec<u8>, jobs: &[pb::Job], layout: Layout) {
    struct Page<'a>(&'a [pb::Job]);
    impl serde::Serialize for Page<'_> {
        fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
            let now = crate::format::now_ms();
            ser.collect_seq(self.0.iter().map(|j| JobJson::at(j, now)))
        }
    }
    out.clear();
    crate::pretty::to_writer(out, &Page(jobs), layout).expect("jobs serialize to a Vec");
}

/// The buffers pages were written into, given back once printed: a page's JSON is
/// larger than what the allocator keeps on its heap, so a new buffer for each page
/// would be memory mapped and faulted in page by page, every time.
#[derive(Default)]
struct Buffers(std::sync::Mutex<Vec<Vec<u8>>>);

impl Buffers {
    fn take(&self) -> Vec<u8> {
        let spare = self.0.lock().unwrap_or_else(|p| p.into_inner()).pop();
        spare.unwrap_or_default()
    }

    fn give(&self, buffer: Vec<u8>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(buffer);
    }
}

/// The part of `page_json`'s output that goes between the array's brackets.
fn inner(page: &[u8], layout: Layout) -> &[u8] {
    let close = match layout {
        Layout::Pretty => 2,
        Layout::Compact => 1,
    };
    match page {
        b"[]" => b"",
        p => &p[1..p.len() - close],
    }
}

/// Writes pages, given in order as they come, as one JSON array and a newline.
struct Joined<W: Write> {
    out: W,
    any: bool,
    layout: Layout,
}

impl<W: Write> Joined<W> {
    fn push(&mut self, page: &[u8]) -> std::io::Result<()> {
        let part = inner(page, self.layout);
        if part.is_empty() {
            return Ok(());
        }
        self.out.write_all(if self.any { b"," } else { b"[" })?;
        self.any = true;
        self.out.write_all(part)
    }

    fn finish(mut self) -> std::io::Result<()> {
        let end: &[u8] = match (self.any, self.layout) {
            (false, _) => b"[]\n",
            (true, Layout::Pretty) => b"\n]\n",
            (true, Layout::Compact) => b"]\n",
        };
        self.out.write_all(end)?;
        self.out.flush()
    }
}

/// Decodes and writes the pages that come on `pages` (numbered from 0, in order) to
/// stdout. Returns why it stopped early, if it did (the output is then incomplete).
pub fn print(pages: Receiver<(usize, bytes::Bytes)>) -> Result<(), String> {
    // Pages go straight to stdout (a page is larger than the buffer); only the commas
    // and brackets between them are buffered. Through a file of its own, not std's
    // line-buffered stdout, which looks through every page for its last line break.
    let stdout = std::io::stdout();
    let fd = std::os::fd::AsFd::as_fd(&stdout).try_clone_to_owned();
    let Ok(fd) = fd else {
        return Err("cannot write output: stdout cannot be duplicated".into());
    };
    let out = std::io::BufWriter::with_capacity(16 << 10, std::fs::File::from(fd));
    match write_pages(pages, out, Layout::for_stdout()) {
        Err(Failed::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(0)
        }
        Err(Failed::Output(e)) => Err(format!("cannot write output: {e}")),
        Err(Failed::Page(e)) => Err(e),
        Ok(()) => Ok(()),
    }
}

enum Failed {
    Output(std::io::Error),
    Page(String),
}

fn write_pages(
    pages: Receiver<(usize, bytes::Bytes)>,
    out: impl Write,
    layout: Layout,
) -> Result<(), Failed> {
    let pages = std::sync::Mutex::new(pages);
    let (done_tx, done_rx) = sync_channel::<(usize, Result<Vec<u8>, String>)>(2 * WORKERS);
    let buffers = Buffers::default();
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            let (pages, done_tx, buffers) = (&pages, done_tx.clone(), &buffers);
            s.spawn(move || work(pages, done_tx, buffers, layout));
        }
        drop(done_tx);
        let mut joined = Joined {
            out,
            any: false,
            layout,
        };
        let mut early: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        let mut next = 0;
        // Every finished page is taken off the channel (the workers never wait on a
        // full one), and printed once the pages before it are.
        for (n, page) in done_rx {
            early.insert(n, page.map_err(Failed::Page)?);
            while let Some(p) = early.remove(&next) {
                joined.push(&p).map_err(Failed::Output)?;
                buffers.give(p);
                next += 1;
            }
        }
        joined.finish().map_err(Failed::Output)
    })
}

fn work(
    pages: &std::sync::Mutex<Receiver<(usize, bytes::Bytes)>>,
    done: SyncSender<(usize, Result<Vec<u8>, String>)>,
    buffers: &Buffers,
    layout: Layout,
) {
    loop {
        let next = pages.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok((n, bytes)) = next else { return };
        let page = pb::ListJobsResponse::decode(bytes)
            .map(|p| {
                let mut out = buffers.take();
                page_json_into(&mut out, &p.jobs, layout);
                out
            })
            .map_err(|e| format!("a page of the listing does not decode: {e}"));
        if done.send((n, page)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64) -> pb::Job {
        pb::Job {
            id,
            state: pb::JobState::Pending as i32,
            reason: "Priority".into(),
            submit_time_ms: 1_700_000_000_000 + id as i64,
            warnings: if id.is_multiple_of(3) {
                vec!["w \"quoted\"".into()]
            } else {
                vec![]
            },
            spec: Some(pb::JobSpec {
                name: format!("job-{id}\n"),
                user: "alice".into(),
                command: vec!["python3".into(), "train.py".into()],
                env: [("A".to_string(), "1".to_string())].into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Pages of any sizes (empty ones too), printed in any order of completion, give
    /// the bytes of the whole list serialized at once, in either layout; both layouts
    /// are the same JSON.
    #[test]
    fn pages_join_into_the_whole_array() {
        let jobs: Vec<pb::Job> = (1..=23).map(job).collect();
        let mut values = Vec::new();
        for layout in [Layout::Pretty, Layout::Compact] {
            let mut whole = page_json(&jobs, layout);
            whole.push(b'\n');
            for sizes in [vec![23], vec![1, 22], vec![0, 5, 0, 7, 11, 0], vec![1; 23]] {
                let (tx, rx) = sync_channel(64);
                let mut at = 0;
                for (n, size) in sizes.iter().enumerate() {
                    let page = pb::ListJobsResponse {
                        jobs: jobs[at..at + size].to_vec(),
                        ..Default::default()
                    };
                    tx.send((n, page.encode_to_vec().into())).unwrap();
                    at += size;
                }
                drop(tx);
                let mut out = Vec::new();
                assert!(write_pages(rx, &mut out, layout).is_ok());
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    String::from_utf8(whole.clone()).unwrap(),
                    "pages of {sizes:?}, {layout:?}"
                );
            }
            let text = String::from_utf8(whole).unwrap();
            assert_eq!(
                text.lines().count() == 1,
                layout == Layout::Compact,
                "{text}"
            );
            values.push(serde_json::from_str::<serde_json::Value>(&text).unwrap());
            let (tx, rx) = sync_channel(1);
            drop(tx);
            let mut out = Vec::new();
            assert!(write_pages(rx, &mut out, layout).is_ok());
            assert_eq!(out, b"[]\n", "no page at all");
        }
        assert_eq!(values[0], values[1]);
        assert_eq!(values[0].as_array().unwrap().len(), 23);
    }

    #[test]
    fn a_page_that_does_not_decode_stops_the_output() {
        let (tx, rx) = sync_channel(4);
        let good = pb::ListJobsResponse {
            jobs: vec![job(1)],
            ..Default::default()
        };
        tx.send((0, good.encode_to_vec().into())).unwrap();
        tx.send((1, bytes::Bytes::from_static(&[0x0a, 0xff])))
            .unwrap();
        drop(tx);
        match write_pages(rx, Vec::new(), Layout::Compact) {
            Err(Failed::Page(e)) => assert!(e.contains("does not decode"), "{e}"),
            _ => panic!("a bad page must fail the listing"),
        }
    }
}
