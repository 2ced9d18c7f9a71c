//! A job encoded as the protobuf `Job` straight from core's record, field by field: a
//! listing of 10,000 jobs is encoded without building (and copying into) 10,000
//! protobuf messages first. The bytes decode as `Job::from(&record)` does; a test
//! holds the two together (`tests.rs`), field numbers are those of `gpuctl.proto`.

use prost::encoding::{
    WireType, bool as pbool, double, encode_key, encode_varint, encoded_len_varint, int32, int64,
    key_len, string, uint32, uint64,
};

use gpuctl_core::record::{
    Allocation, Dependency, GpuPart, Job, JobSpec, JobUsage, Record, Resources, SlotUsage, SlotUse,
    Step,
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

impl Encode for GpuPart {
    /// The oneof's member, written whatever its value (as a set oneof is).
    fn len(&self) -> usize {
        match self {
            GpuPart::Gpus(n) => uint32::encoded_len(1, n),
            GpuPart::Share(s) => nested_len(
                12,
                u32_len(1, &s.compute_milli)
                    + s.memory_mib.map_or(0, |m| uint64::encoded_len(2, &m)),
            ),
            GpuPart::Mig(m) => nested_len(13, str_len(1, &m.profile) + u32_len(2, &m.count)),
        }
    }

    fn put(&self, buf: &mut Vec<u8>) {
        match self {
            GpuPart::Gpus(n) => uint32::encode(1, n, buf),
            GpuPart::Share(s) => {
                encode_key(12, WireType::LengthDelimited, buf);
                let body = u32_len(1, &s.compute_milli)
                    + s.memory_mib.map_or(0, |m| uint64::encoded_len(2, &m));
                encode_varint(body as u64, buf);
                put_u32(1, &s.compute_milli, buf);
                if let Some(m) = s.memory_mib {
                    uint64::encode(2, &m, buf);
                }
            }
            GpuPart::Mig(m) => {
                encode_key(13, WireType::LengthDelimited, buf);
                encode_varint((str_len(1, &m.profile) + u32_len(2, &m.count)) as u64, buf);
                put_str(1, &m.profile, buf);
                put_u32(2, &m.count, buf);
            }
        }
    }
}

impl Encode for Resources {
    fn len(&self) -> usize {
        self.gpu.as_ref().map_or(0, Encode::len)
            + u32_len(2, &self.cpus)
            + u64_len(3, &self.memory_bytes)
            + u64_len(4, &self.time_limit_secs)
            + string::encoded_len_repeated(7, &self.gpu_models)
            + u32_len(10, &self.nodes)
            + u32_len(11, &self.cpu_milli)
            + string::encoded_len_repeated(14, &self.nodelist)
            + string::encoded_len_repeated(15, &self.exclude)
            + str_len(16, &self.constraint)
            + u32_len(17, &self.tasks_per_node)
            + bool_len(18, &self.exclusive)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        // In field-number order, as prost writes them (the oneof's members last).
        put_u32(2, &self.cpus, buf);
        put_u64(3, &self.memory_bytes, buf);
        put_u64(4, &self.time_limit_secs, buf);
        string::encode_repeated(7, &self.gpu_models, buf);
        put_u32(10, &self.nodes, buf);
        put_u32(11, &self.cpu_milli, buf);
        string::encode_repeated(14, &self.nodelist, buf);
        string::encode_repeated(15, &self.exclude, buf);
        put_str(16, &self.constraint, buf);
        put_u32(17, &self.tasks_per_node, buf);
        put_bool(18, &self.exclusive, buf);
        if let Some(g) = &self.gpu {
            g.put(buf);
        }
    }
}

impl Encode for Dependency {
    fn len(&self) -> usize {
        i32_len(1, &dependency_number(self.kind)) + u64_len(2, &self.job_id)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        put_i32(1, &dependency_number(self.kind), buf);
        put_u64(2, &self.job_id, buf);
    }
}

/// One entry of the `env` map: a message of key (1) and value (2).
fn env_entry_len(k: &String, v: &String) -> usize {
    str_len(1, k) + str_len(2, v)
}

impl Encode for JobSpec {
    fn len(&self) -> usize {
        let env: usize = (self.env.iter())
            .map(|(k, v)| nested_len(7, env_entry_len(k, v)))
            .sum();
        str_len(1, &self.name)
            + string::encoded_len_repeated(2, &self.command)
            + str_len(3, &self.script)
            + str_len(4, &self.workdir)
            + str_len(5, &self.stdout)
            + str_len(6, &self.stderr)
            + env
            + i32_len(8, &self.priority)
            + message_len(9, &self.resources)
            + str_len(10, &self.user)
            + u32_len(11, &self.uid)
            + u32_len(12, &self.gid)
            + str_len(13, &self.qos)
            + bool_len(14, &self.requeue)
            + messages_len(15, &self.dependencies)
            + str_len(16, &self.account)
            + str_len(17, &self.signal)
            + str_len(18, &self.array)
            + u64_len(19, &self.array_job_id)
            + self
                .array_task_id
                .map_or(0, |t| uint32::encoded_len(20, &t))
            + str_len(21, &self.partition)
            + bool_len(22, &self.right_size)
            + i64_len(23, &self.begin_ms)
            + bool_len(24, &self.colocate)
            + u32_len(25, &self.max_restarts)
            + bool_len(26, &self.interactive)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        put_str(1, &self.name, buf);
        string::encode_repeated(2, &self.command, buf);
        put_str(3, &self.script, buf);
        put_str(4, &self.workdir, buf);
        put_str(5, &self.stdout, buf);
        put_str(6, &self.stderr, buf);
        for (k, v) in &self.env {
            encode_key(7, WireType::LengthDelimited, buf);
            encode_varint(env_entry_len(k, v) as u64, buf);
            put_str(1, k, buf);
            put_str(2, v, buf);
        }
        put_i32(8, &self.priority, buf);
        message(9, &self.resources, buf);
        put_str(10, &self.user, buf);
        put_u32(11, &self.uid, buf);
        put_u32(12, &self.gid, buf);
        put_str(13, &self.qos, buf);
        put_bool(14, &self.requeue, buf);
        messages(15, &self.dependencies, buf);
        put_str(16, &self.account, buf);
        put_str(17, &self.signal, buf);
        put_str(18, &self.array, buf);
        put_u64(19, &self.array_job_id, buf);
        if let Some(t) = self.array_task_id {
            uint32::encode(20, &t, buf);
        }
        put_str(21, &self.partition, buf);
        put_bool(22, &self.right_size, buf);
        put_i64(23, &self.begin_ms, buf);
        put_bool(24, &self.colocate, buf);
        put_u32(25, &self.max_restarts, buf);
        put_bool(26, &self.interactive, buf);
    }
}

impl Encode for SlotUse {
    fn len(&self) -> usize {
        str_len(1, &self.uuid) + u32_len(2, &self.compute_milli) + u64_len(3, &self.memory_mib)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        put_str(1, &self.uuid, buf);
        put_u32(2, &self.compute_milli, buf);
        put_u64(3, &self.memory_mib, buf);
    }
}

impl Encode for Allocation {
    fn len(&self) -> usize {
        str_len(1, &self.node)
            + messages_len(2, &self.slots)
            + u32_len(3, &self.cpu_milli)
            + u64_len(4, &self.memory_bytes)
            + u32_len(5, &self.rank)
            + bool_len(6, &self.ended)
            + i32_len(7, &self.state.map_or(0, state_number))
            + self.exit_code.map_or(0, |c| int32::encoded_len(8, &c))
            + str_len(9, &self.reason)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        put_str(1, &self.node, buf);
        messages(2, &self.slots, buf);
        put_u32(3, &self.cpu_milli, buf);
        put_u64(4, &self.memory_bytes, buf);
        put_u32(5, &self.rank, buf);
        put_bool(6, &self.ended, buf);
        put_i32(7, &self.state.map_or(0, state_number), buf);
        if let Some(c) = self.exit_code {
            int32::encode(8, &c, buf);
        }
        put_str(9, &self.reason, buf);
    }
}

impl Encode for Step {
    fn len(&self) -> usize {
        u32_len(1, &self.id)
            + str_len(2, &self.name)
            + i64_len(3, &self.start_ms)
            + i64_len(4, &self.end_ms)
            + self.exit_code.map_or(0, |c| int32::encoded_len(5, &c))
            + u32_len(6, &self.tasks)
            + string::encoded_len_repeated(7, &self.nodes)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        put_u32(1, &self.id, buf);
        put_str(2, &self.name, buf);
        put_i64(3, &self.start_ms, buf);
        put_i64(4, &self.end_ms, buf);
        if let Some(c) = self.exit_code {
            int32::encode(5, &c, buf);
        }
        put_u32(6, &self.tasks, buf);
        string::encode_repeated(7, &self.nodes, buf);
    }
}

impl Encode for SlotUsage {
    fn len(&self) -> usize {
        str_len(1, &self.node)
            + str_len(2, &self.uuid)
            + u32_len(3, &self.share_milli)
            + u64_len(4, &self.memory_mib)
            + u64_len(5, &self.samples)
            + f64_len(6, &self.util_sum)
            + f64_len(7, &self.util_max)
            + u64_len(8, &self.mem_peak_mib)
            + f64_len(9, &self.mem_sum_mib)
            + f64_len(10, &self.energy_j)
            + i64_len(11, &self.last_sample_ms)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        put_str(1, &self.node, buf);
        put_str(2, &self.uuid, buf);
        put_u32(3, &self.share_milli, buf);
        put_u64(4, &self.memory_mib, buf);
        put_u64(5, &self.samples, buf);
        put_f64(6, &self.util_sum, buf);
        put_f64(7, &self.util_max, buf);
        put_u64(8, &self.mem_peak_mib, buf);
        put_f64(9, &self.mem_sum_mib, buf);
        put_f64(10, &self.energy_j, buf);
        put_i64(11, &self.last_sample_ms, buf);
    }
}

impl Encode for JobUsage {
    fn len(&self) -> usize {
        messages_len(1, &self.slots)
            + u64_len(2, &self.cpu_time_ms)
            + u64_len(3, &self.host_mem_peak_bytes)
            + u32_len(4, &self.host_reports)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        messages(1, &self.slots, buf);
        put_u64(2, &self.cpu_time_ms, buf);
        put_u64(3, &self.host_mem_peak_bytes, buf);
        put_u32(4, &self.host_reports, buf);
    }
}

impl Encode for Job {
    fn len(&self) -> usize {
        u64_len(1, &self.id)
            + message_len(2, &self.spec)
            + i32_len(3, &state_number(self.state))
            + str_len(4, &self.node)
            + string::encoded_len_repeated(5, &self.gpus)
            + str_len(6, &self.reason)
            + self.exit_code.map_or(0, |c| int32::encoded_len(7, &c))
            + i64_len(8, &self.submit_time_ms)
            + i64_len(9, &self.start_time_ms)
            + i64_len(10, &self.end_time_ms)
            + u64_len(11, &self.time_limit_secs)
            + messages_len(12, &self.allocations)
            + i64_len(13, &self.expected_start_ms)
            + u32_len(14, &self.attempt)
            + string::encoded_len_repeated(15, &self.warnings)
            + str_len(16, &self.hold)
            + self.usage.as_ref().map_or(0, |u| message_len(17, u))
            + i64_len(18, &self.launch_time_ms)
            + u32_len(19, &self.restarts)
            + messages_len(20, &self.steps)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        put_u64(1, &self.id, buf);
        message(2, &self.spec, buf);
        put_i32(3, &state_number(self.state), buf);
        put_str(4, &self.node, buf);
        string::encode_repeated(5, &self.gpus, buf);
        put_str(6, &self.reason, buf);
        if let Some(c) = self.exit_code {
            int32::encode(7, &c, buf);
        }
        put_i64(8, &self.submit_time_ms, buf);
        put_i64(9, &self.start_time_ms, buf);
        put_i64(10, &self.end_time_ms, buf);
        put_u64(11, &self.time_limit_secs, buf);
        messages(12, &self.allocations, buf);
        put_i64(13, &self.expected_start_ms, buf);
        put_u32(14, &self.attempt, buf);
        string::encode_repeated(15, &self.warnings, buf);
        put_str(16, &self.hold, buf);
        if let Some(u) = &self.usage {
            message(17, u, buf);
        }
        put_i64(18, &self.launch_time_ms, buf);
        put_u32(19, &self.restarts, buf);
        messages(20, &self.steps, buf);
    }
}

/// The length of `j` encoded as a protobuf `Job` (its body, without a length prefix).
pub fn job_encoded_len(j: &Job) -> usize {
    j.len()
}

/// `j` encoded as a protobuf `Job` (its body, as `prost::Message::encode_raw` writes it):
/// `job_encoded_len(j)` bytes.
pub fn encode_job(j: &Job, buf: &mut Vec<u8>) {
    j.put(buf);
}

impl Encode for Record {
    fn len(&self) -> usize {
        message_len(1, &self.job)
            + bool_len(2, &self.cancel_requested)
            + bool_len(3, &self.start_confirmed)
            + self.requeued_from.as_ref().map_or(0, |j| message_len(4, j))
            + str_len(5, &self.request_id)
            + str_len(6, &self.requeue_requested)
            + u64_len(7, &self.preempted_by)
            + i64_len(8, &self.vacate_by_ms)
    }

    fn put(&self, buf: &mut Vec<u8>) {
        message(1, &self.job, buf);
        put_bool(2, &self.cancel_requested, buf);
        put_bool(3, &self.start_confirmed, buf);
        if let Some(j) = &self.requeued_from {
            message(4, j, buf);
        }
        put_str(5, &self.request_id, buf);
        put_str(6, &self.requeue_requested, buf);
        put_u64(7, &self.preempted_by, buf);
        put_i64(8, &self.vacate_by_ms, buf);
    }
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
