//! `ListJobsResponse` (`repeated Job jobs = 1` in gpuctl.proto), written here instead
//! of generated (`extern_path` in build.rs) so that a server can send jobs it encoded
//! itself: the controller encodes a page of a 10,000-job listing straight from its
//! records, without first copying every job into a message of its own. On the wire it
//! is exactly the generated message; a decoded page has its jobs in `jobs` only.

use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType};

use crate::Job;

/// A page of a job listing.
#[derive(Clone, PartialEq, Default)]
pub struct ListJobsResponse {
    pub jobs: Vec<Job>,
    /// Jobs already encoded as this message's field 1 (each its key, its length and
    /// its body: [`ListJobsResponse::push_encoded`]), sent after `jobs`. Empty in a
    /// decoded page.
    pub encoded: Bytes,
}

// The field number of `jobs`.
use crate::tags::list_jobs_response::jobs as JOBS;

impl ListJobsResponse {
    /// Appends one job to `out` as field 1 of this message: its key, then `len` (the
    /// length of what `body` writes), then what `body` writes.
    pub fn push_encoded(out: &mut Vec<u8>, len: usize, body: impl FnOnce(&mut Vec<u8>)) {
        prost::encoding::encode_key(JOBS, WireType::LengthDelimited, out);
        prost::encoding::encode_varint(len as u64, out);
        let at = out.len();
        body(out);
        debug_assert_eq!(out.len() - at, len, "the job's encoded length");
    }
}

impl prost::Message for ListJobsResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for job in &self.jobs {
            prost::encoding::message::encode(JOBS, job, buf);
        }
        buf.put_slice(&self.encoded);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        if tag == JOBS {
            prost::encoding::message::merge_repeated(wire_type, &mut self.jobs, buf, ctx).map_err(
                |mut e| {
                    e.push("ListJobsResponse", "jobs");
                    e
                },
            )
        } else {
            prost::encoding::skip_field(wire_type, tag, buf, ctx)
        }
    }

    fn encoded_len(&self) -> usize {
        prost::encoding::message::encoded_len_repeated(JOBS, &self.jobs) + self.encoded.len()
    }

    fn clear(&mut self) {
        self.jobs.clear();
        self.encoded = Bytes::new();
    }
}

impl std::fmt::Debug for ListJobsResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListJobsResponse")
            .field("jobs", &self.jobs)
            .field("encoded_bytes", &self.encoded.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    fn job(id: u64) -> Job {
        Job {
            id,
            node: format!("n{id}"),
            gpus: vec!["GPU-1".into(), "GPU-2".into()],
            ..Default::default()
        }
    }

    /// Jobs in `jobs`, jobs pushed encoded, or both: the same bytes as the message with
    /// all of them in `jobs`, and they decode to that message.
    #[test]
    fn encoded_jobs_are_the_same_message_on_the_wire() {
        let all = ListJobsResponse {
            jobs: (1..=5).map(job).collect(),
            encoded: Bytes::new(),
        };
        let mut encoded = Vec::new();
        for j in &all.jobs[2..] {
            ListJobsResponse::push_encoded(&mut encoded, j.encoded_len(), |out| j.encode_raw(out));
        }
        let mixed = ListJobsResponse {
            jobs: all.jobs[..2].to_vec(),
            encoded: encoded.into(),
        };
        assert_eq!(mixed.encoded_len(), all.encoded_len());
        assert_eq!(mixed.encode_to_vec(), all.encode_to_vec());
        let back = ListJobsResponse::decode(&mixed.encode_to_vec()[..]).unwrap();
        assert_eq!(back, all);
        assert!(ListJobsResponse::decode(&[0x0a, 0xff][..]).is_err());
    }
}
