//! A job encoded as the protobuf `Job` straight from core's record, field by field: a
//! listing of 10,000 jobs is encoded without building (and copying into) 10,000
//! protobuf messages first. The bytes decode as `Job::from(&record)` does; a test
//! holds the two together (`tests.rs`); every field number is read from `crate::tags`,
//! which build.rs generates from `gpuctl.proto` and `store.proto`.

use prost::encoding::{
    WireType, bool as pbool, double, encode_key, encode_varint, encoded_len_varint, int32, int64,
    key_len, string, uint32, uint64,
};

use gpuctl_core::record::{
    Allocation, Dependency, GpuPart, GpuShare, Job, JobSpec, JobUsage, MigInstances, Record,
    Resources, SlotUsage, SlotUse, Step,
};

use super::{dependency_number, state_number};
use crate::tags;

/// What a nested message needs: its length, then its fields.
trait Encode {
    fn len(&self) -> usize;
    fn put(&self, buf: &mut Vec<u8>);
}

/// The length of a nested message field whose body is `body` bytes long.
fn nested_len(tag: u32, body: usize) -> usize {
    key_len(tag) + encoded_len_varint(body as u64) + body
}

fn message_len(tag: u32, m: &impl Encode) -> usize {
    nested_len(tag, m.len())
}

fn message(tag: u32, m: &impl Encode, buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(m.len() as u64, buf);
    m.put(buf);
}

fn messages_len<M: Encode>(tag: u32, ms: &[M]) -> usize {
    ms.iter().map(|m| message_len(tag, m)).sum()
}

fn messages<M: Encode>(tag: u32, ms: &[M], buf: &mut Vec<u8>) {
    for m in ms {
        message(tag, m, buf);
    }
}

/// Proto3 scalars are written only when they are not their default; `optional` ones
/// whenever they are set.
macro_rules! scalar {
    ($len:ident, $put:ident, $kind:ident, $ty:ty, $zero:expr) => {
        fn $len(tag: u32, v: &$ty) -> usize {
            if *v == $zero {
                0
            } else {
                $kind::encoded_len(tag, v)
            }
        }
        fn $put(tag: u32, v: &$ty, buf: &mut Vec<u8>) {
            if *v != $zero {
                $kind::encode(tag, v, buf);
            }
        }
    };
}

scalar!(u32_len, put_u32, uint32, u32, 0);
scalar!(u64_len, put_u64, uint64, u64, 0);
scalar!(i32_len, put_i32, int32, i32, 0);
scalar!(i64_len, put_i64, int64, i64, 0);
scalar!(bool_len, put_bool, pbool, bool, false);
scalar!(f64_len, put_f64, double, f64, 0.0);

fn str_len(tag: u32, v: &String) -> usize {
    if v.is_empty() {
        0
    } else {
        string::encoded_len(tag, v)
    }
}

fn put_str(tag: u32, v: &String, buf: &mut Vec<u8>) {
    if !v.is_empty() {
        string::encode(tag, v, buf);
    }
}

/// The length of a plain field of kind `$k` (core's field lists: `string`, `u32`,
/// `opt_i32`, ...) as field `$t`, written as prost writes it.
macro_rules! field_len {
    (string, $t:expr, $v:expr) => {
        str_len($t, $v)
    };
    (strings, $t:expr, $v:expr) => {
        string::encoded_len_repeated($t, $v)
    };
    (u32, $t:expr, $v:expr) => {
        u32_len($t, $v)
    };
    (u64, $t:expr, $v:expr) => {
        u64_len($t, $v)
    };
    (i32, $t:expr, $v:expr) => {
        i32_len($t, $v)
    };
    (i64, $t:expr, $v:expr) => {
        i64_len($t, $v)
    };
    (bool, $t:expr, $v:expr) => {
        bool_len($t, $v)
    };
    (f64, $t:expr, $v:expr) => {
        f64_len($t, $v)
    };
    (opt_u32, $t:expr, $v:expr) => {
        $v.as_ref().map_or(0, |x| uint32::encoded_len($t, x))
    };
    (opt_u64, $t:expr, $v:expr) => {
        $v.as_ref().map_or(0, |x| uint64::encoded_len($t, x))
    };
    (opt_i32, $t:expr, $v:expr) => {
        $v.as_ref().map_or(0, |x| int32::encoded_len($t, x))
    };
}

/// Writes a plain field of kind `$k` as field `$t`.
macro_rules! field_put {
    (string, $t:expr, $v:expr, $buf:ident) => {
        put_str($t, $v, $buf)
    };
    (strings, $t:expr, $v:expr, $buf:ident) => {
        string::encode_repeated($t, $v, $buf)
    };
    (u32, $t:expr, $v:expr, $buf:ident) => {
        put_u32($t, $v, $buf)
    };
    (u64, $t:expr, $v:expr, $buf:ident) => {
        put_u64($t, $v, $buf)
    };
    (i32, $t:expr, $v:expr, $buf:ident) => {
        put_i32($t, $v, $buf)
    };
    (i64, $t:expr, $v:expr, $buf:ident) => {
        put_i64($t, $v, $buf)
    };
    (bool, $t:expr, $v:expr, $buf:ident) => {
        put_bool($t, $v, $buf)
    };
    (f64, $t:expr, $v:expr, $buf:ident) => {
        put_f64($t, $v, $buf)
    };
    (opt_u32, $t:expr, $v:expr, $buf:ident) => {
        if let Some(x) = $v {
            uint32::encode($t, x, $buf)
        }
    };
    (opt_u64, $t:expr, $v:expr, $buf:ident) => {
        if let Some(x) = $v {
            uint64::encode($t, x, $buf)
        }
    };
    (opt_i32, $t:expr, $v:expr, $buf:ident) => {
        if let Some(x) = $v {
            int32::encode($t, x, $buf)
        }
    };
}

/// The encoded length of `$v`'s plain fields (the list core's macro hands over).
macro_rules! plain_len {
    ($v:ident, $m:ident; $($f:ident: $k:ident,)*) => {
        0 $(+ field_len!($k, crate::tags::$m::$f, &$v.$f))*
    };
}

/// Writes `$v`'s plain fields.
macro_rules! plain_put {
    ($v:ident, $m:ident, $buf:ident; $($f:ident: $k:ident,)*) => {
        $(field_put!($k, crate::tags::$m::$f, &$v.$f, $buf);)*
    };
}

/// `Encode` for a message of plain fields and `special` ones (`len` and `put` of each
/// given by hand): `$list` is core's field-list macro for it, `$m` the message's module
/// of field numbers (`crate::tags`).
macro_rules! encode {
    ($ty:ident, $list:ident, $m:ident, |$v:ident, $buf:ident| len: $len:expr, put: $put:block) => {
        impl Encode for $ty {
            fn len(&self) -> usize {
                let $v = self;
                gpuctl_core::$list!(plain_len!($v, $m)) + $len
            }

            fn put(&self, $buf: &mut Vec<u8>) {
                let $v = self;
                gpuctl_core::$list!(plain_put!($v, $m, $buf));
                $put
            }
        }
    };
}

encode!(GpuShare, gpu_share_fields, gpu_share, |_s, _buf| len: 0, put: {});
encode!(MigInstances, mig_fields, mig_instances, |_m, _buf| len: 0, put: {});
encode!(SlotUse, slot_use_fields, slot_use, |_s, _buf| len: 0, put: {});
encode!(Step, step_fields, step, |_s, _buf| len: 0, put: {});
encode!(SlotUsage, slot_usage_fields, slot_usage, |_s, _buf| len: 0, put: {});

impl Encode for GpuPart {
    /// The oneof's member, written whatever its value (as a set oneof is).
    fn len(&self) -> usize {
        match self {
            GpuPart::Gpus(n) => uint32::encoded_len(tags::resources::gpus, n),
            GpuPart::Share(s) => message_len(tags::resources::share, s),
            GpuPart::Mig(m) => message_len(tags::resources::mig, m),
        }
    }

    fn put(&self, buf: &mut Vec<u8>) {
        match self {
            GpuPart::Gpus(n) => uint32::encode(tags::resources::gpus, n, buf),
            GpuPart::Share(s) => message(tags::resources::share, s, buf),
            GpuPart::Mig(m) => message(tags::resources::mig, m, buf),
        }
    }
}

encode!(Resources, resources_fields, resources, |r, buf|
    len: r.gpu.as_ref().map_or(0, Encode::len),
    put: {
        if let Some(g) = &r.gpu {
            g.put(buf);
        }
    }
);

encode!(Dependency, dependency_fields, dependency, |d, buf|
    len: i32_len(tags::dependency::kind, &dependency_number(d.kind)),
    put: { put_i32(tags::dependency::kind, &dependency_number(d.kind), buf); }
);

/// One entry of the `env` map: a message of key (1) and value (2), as protobuf writes
/// every map's entries.
fn env_entry_len(k: &String, v: &String) -> usize {
    str_len(1, k) + str_len(2, v)
}

encode!(JobSpec, job_spec_fields, job_spec, |s, buf|
    len: {
        let env: usize = (s.env.iter())
            .map(|(k, v)| nested_len(tags::job_spec::env, env_entry_len(k, v)))
            .sum();
        env + message_len(tags::job_spec::resources, &s.resources)
            + messages_len(tags::job_spec::dependencies, &s.dependencies)
    },
    put: {
        for (k, v) in &s.env {
            encode_key(tags::job_spec::env, WireType::LengthDelimited, buf);
            encode_varint(env_entry_len(k, v) as u64, buf);
            put_str(1, k, buf);
            put_str(2, v, buf);
        }
        message(tags::job_spec::resources, &s.resources, buf);
        messages(tags::job_spec::dependencies, &s.dependencies, buf);
    }
);

encode!(Allocation, allocation_fields, allocation, |a, buf|
    len: messages_len(tags::allocation::slots, &a.slots)
        + i32_len(tags::allocation::state, &a.state.map_or(0, state_number)),
    put: {
        messages(tags::allocation::slots, &a.slots, buf);
        put_i32(tags::allocation::state, &a.state.map_or(0, state_number), buf);
    }
);

encode!(JobUsage, job_usage_fields, job_usage, |u, buf|
    len: messages_len(tags::job_usage::slots, &u.slots),
    put: { messages(tags::job_usage::slots, &u.slots, buf); }
);

encode!(Job, job_fields, job, |j, buf|
    len: message_len(tags::job::spec, &j.spec)
        + i32_len(tags::job::state, &state_number(j.state))
        + messages_len(tags::job::allocations, &j.allocations)
        + j.usage.as_ref().map_or(0, |u| message_len(tags::job::usage, u))
        + messages_len(tags::job::steps, &j.steps),
    put: {
        message(tags::job::spec, &j.spec, buf);
        put_i32(tags::job::state, &state_number(j.state), buf);
        messages(tags::job::allocations, &j.allocations, buf);
        if let Some(u) = &j.usage {
            message(tags::job::usage, u, buf);
        }
        messages(tags::job::steps, &j.steps, buf);
    }
);

encode!(Record, record_fields, stored_job, |r, buf|
    len: message_len(tags::stored_job::job, &r.job)
        + (r.requeued_from.as_ref()).map_or(0, |j| message_len(tags::stored_job::requeued_from, j)),
    put: {
        message(tags::stored_job::job, &r.job, buf);
        if let Some(j) = &r.requeued_from {
            message(tags::stored_job::requeued_from, j, buf);
        }
    }
);

/// The length of `j` encoded as a protobuf `Job` (its body, without a length prefix).
pub fn job_encoded_len(j: &Job) -> usize {
    j.len()
}

/// `j` encoded as a protobuf `Job` (its body, as `prost::Message::encode_raw` writes it):
/// `job_encoded_len(j)` bytes.
pub fn encode_job(j: &Job, buf: &mut Vec<u8>) {
    j.put(buf);
}

/// A job's record as the store writes it (a `StoredJob`), encoded straight from core's.
pub fn encode_record(r: &Record) -> Vec<u8> {
    let mut buf = Vec::with_capacity(r.len());
    r.put(&mut buf);
    buf
}

/// A job's usage as the field `tag` of a message (a listing adds a live job's).
pub fn usage_field_len(tag: u32, u: &JobUsage) -> usize {
    message_len(tag, u)
}

/// Writes a job's usage as the field `tag` of a message.
pub fn encode_usage_field(tag: u32, u: &JobUsage, buf: &mut Vec<u8>) {
    message(tag, u, buf);
}
