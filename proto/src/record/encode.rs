//! A job encoded as the protobuf `Job` straight from core's record, field by field: a
//! listing of 10,000 jobs is encoded without building (and copying into) 10,000
//! protobuf messages first. The bytes decode as `Job::from(&record)` does; a test
//! holds the two together (`tests.rs`), field numbers are those of `gpuctl.proto`.

use prost::encoding::{
    WireType, bool as pbool, double, encode_key, encode_varint, encoded_len_varint, int32, int64,
    key_len, string, uint32, uint64,
};

use gpuctl_core::record::{
    Allocation, Dependency, GpuPart, GpuShare, Job, JobSpec, JobUsage, MigInstances, Record,
    Resources, SlotUsage, SlotUse, Step,
};

use super::{dependency_number, state_number};

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
    (string, $t:literal, $v:expr) => {
        str_len($t, $v)
    };
    (strings, $t:literal, $v:expr) => {
        string::encoded_len_repeated($t, $v)
    };
    (u32, $t:literal, $v:expr) => {
        u32_len($t, $v)
    };
    (u64, $t:literal, $v:expr) => {
        u64_len($t, $v)
    };
    (i32, $t:literal, $v:expr) => {
        i32_len($t, $v)
    };
    (i64, $t:literal, $v:expr) => {
        i64_len($t, $v)
    };
    (bool, $t:literal, $v:expr) => {
        bool_len($t, $v)
    };
    (f64, $t:literal, $v:expr) => {
        f64_len($t, $v)
    };
    (opt_u32, $t:literal, $v:expr) => {
        $v.as_ref().map_or(0, |x| uint32::encoded_len($t, x))
    };
    (opt_u64, $t:literal, $v:expr) => {
        $v.as_ref().map_or(0, |x| uint64::encoded_len($t, x))
    };
    (opt_i32, $t:literal, $v:expr) => {
        $v.as_ref().map_or(0, |x| int32::encoded_len($t, x))
    };
}

/// Writes a plain field of kind `$k` as field `$t`.
macro_rules! field_put {
    (string, $t:literal, $v:expr, $buf:ident) => {
        put_str($t, $v, $buf)
    };
    (strings, $t:literal, $v:expr, $buf:ident) => {
        string::encode_repeated($t, $v, $buf)
    };
    (u32, $t:literal, $v:expr, $buf:ident) => {
        put_u32($t, $v, $buf)
    };
    (u64, $t:literal, $v:expr, $buf:ident) => {
        put_u64($t, $v, $buf)
    };
    (i32, $t:literal, $v:expr, $buf:ident) => {
        put_i32($t, $v, $buf)
    };
    (i64, $t:literal, $v:expr, $buf:ident) => {
        put_i64($t, $v, $buf)
    };
    (bool, $t:literal, $v:expr, $buf:ident) => {
        put_bool($t, $v, $buf)
    };
    (f64, $t:literal, $v:expr, $buf:ident) => {
        put_f64($t, $v, $buf)
    };
    (opt_u32, $t:literal, $v:expr, $buf:ident) => {
        if let Some(x) = $v {
            uint32::encode($t, x, $buf)
        }
    };
    (opt_u64, $t:literal, $v:expr, $buf:ident) => {
        if let Some(x) = $v {
            uint64::encode($t, x, $buf)
        }
    };
    (opt_i32, $t:literal, $v:expr, $buf:ident) => {
        if let Some(x) = $v {
            int32::encode($t, x, $buf)
        }
    };
}

/// The encoded length of `$v`'s plain fields (the list core's macro hands over).
macro_rules! plain_len {
    ($v:ident; $($f:ident: $k:ident = $t:literal,)*) => {
        0 $(+ field_len!($k, $t, &$v.$f))*
    };
}

/// Writes `$v`'s plain fields.
macro_rules! plain_put {
    ($v:ident, $buf:ident; $($f:ident: $k:ident = $t:literal,)*) => {
        $(field_put!($k, $t, &$v.$f, $buf);)*
    };
}

/// `Encode` for a message of plain fields and `special` ones (`len` and `put` of each
/// given by hand): `$list` is core's field-list macro for it.
macro_rules! encode {
    ($ty:ident, $list:ident, |$v:ident, $buf:ident| len: $len:expr, put: $put:block) => {
        impl Encode for $ty {
            fn len(&self) -> usize {
                let $v = self;
                gpuctl_core::$list!(plain_len!($v)) + $len
            }

            fn put(&self, $buf: &mut Vec<u8>) {
                let $v = self;
                gpuctl_core::$list!(plain_put!($v, $buf));
                $put
            }
        }
    };
}

encode!(GpuShare, gpu_share_fields, |_s, _buf| len: 0, put: {});
encode!(MigInstances, mig_fields, |_m, _buf| len: 0, put: {});
encode!(SlotUse, slot_use_fields, |_s, _buf| len: 0, put: {});
encode!(Step, step_fields, |_s, _buf| len: 0, put: {});
encode!(SlotUsage, slot_usage_fields, |_s, _buf| len: 0, put: {});

impl Encode for GpuPart {
    /// The oneof's member, written whatever its value (as a set oneof is).
    fn len(&self) -> usize {
        match self {
            GpuPart::Gpus(n) => uint32::encoded_len(1, n),
            GpuPart::Share(s) => message_len(12, s),
            GpuPart::Mig(m) => message_len(13, m),
        }
    }

    fn put(&self, buf: &mut Vec<u8>) {
        match self {
            GpuPart::Gpus(n) => uint32::encode(1, n, buf),
            GpuPart::Share(s) => message(12, s, buf),
            GpuPart::Mig(m) => message(13, m, buf),
        }
    }
}

encode!(Resources, resources_fields, |r, buf|
    len: r.gpu.as_ref().map_or(0, Encode::len),
    put: {
        if let Some(g) = &r.gpu {
            g.put(buf);
        }
    }
);

encode!(Dependency, dependency_fields, |d, buf|
    len: i32_len(1, &dependency_number(d.kind)),
    put: { put_i32(1, &dependency_number(d.kind), buf); }
);

/// One entry of the `env` map: a message of key (1) and value (2).
fn env_entry_len(k: &String, v: &String) -> usize {
    str_len(1, k) + str_len(2, v)
}

encode!(JobSpec, job_spec_fields, |s, buf|
    len: {
        let env: usize = (s.env.iter())
            .map(|(k, v)| nested_len(7, env_entry_len(k, v)))
            .sum();
        env + message_len(9, &s.resources) + messages_len(15, &s.dependencies)
    },
    put: {
        for (k, v) in &s.env {
            encode_key(7, WireType::LengthDelimited, buf);
            encode_varint(env_entry_len(k, v) as u64, buf);
            put_str(1, k, buf);
            put_str(2, v, buf);
        }
        message(9, &s.resources, buf);
        messages(15, &s.dependencies, buf);
    }
);

encode!(Allocation, allocation_fields, |a, buf|
    len: messages_len(2, &a.slots) + i32_len(7, &a.state.map_or(0, state_number)),
    put: {
        messages(2, &a.slots, buf);
        put_i32(7, &a.state.map_or(0, state_number), buf);
    }
);

encode!(JobUsage, job_usage_fields, |u, buf|
    len: messages_len(1, &u.slots),
    put: { messages(1, &u.slots, buf); }
);

encode!(Job, job_fields, |j, buf|
    len: message_len(2, &j.spec)
        + i32_len(3, &state_number(j.state))
        + messages_len(12, &j.allocations)
        + j.usage.as_ref().map_or(0, |u| message_len(17, u))
        + messages_len(20, &j.steps),
    put: {
        message(2, &j.spec, buf);
        put_i32(3, &state_number(j.state), buf);
        messages(12, &j.allocations, buf);
        if let Some(u) = &j.usage {
            message(17, u, buf);
        }
        messages(20, &j.steps, buf);
    }
);

encode!(Record, record_fields, |r, buf|
    len: message_len(1, &r.job) + r.requeued_from.as_ref().map_or(0, |j| message_len(4, j)),
    put: {
        message(1, &r.job, buf);
        if let Some(j) = &r.requeued_from {
            message(4, j, buf);
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
