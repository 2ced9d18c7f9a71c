//! A state dir written before the `gpu` oneof (share and MIG requests as flat fields)
//! opens with every request as it was, and the records are rewritten in the new form.

use gpuctl_proto::auth::ClusterKey;
use gpuctl_proto::store::StoredJob;
use gpuctl_proto::{self as pb, resources::Gpu};
use gpuctld::config::Config;
use gpuctld::controller::Controller;
use gpuctld::store::Store;

#[allow(deprecated)]
fn old_record(id: u64, f: impl FnOnce(&mut pb::Resources)) -> StoredJob {
    let mut r = pb::Resources {
        cpus: 1,
        ..pb::Resources::default()
    };
    f(&mut r);
    StoredJob {
        job: Some(pb::Job {
            id,
            state: pb::JobState::Pending as i32,
            spec: Some(pb::JobSpec {
                user: "alice".into(),
                command: vec!["true".into()],
                workdir: "/tmp".into(),
                resources: Some(r),
                ..pb::JobSpec::default()
            }),
            ..pb::Job::default()
        }),
        ..StoredJob::default()
    }
}

#[test]
#[allow(deprecated)]
fn flat_gpu_fields_of_an_old_state_dir_are_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = Store::open(dir.path()).unwrap();
        let share = old_record(1, |r| {
            r.legacy_gpu_milli = 250;
            r.legacy_gpu_memory_mib = 4096;
        });
        let mig = old_record(2, |r| {
            r.legacy_mig_profile = "3g.40gb".into();
            r.legacy_mig_count = 2;
        });
        let whole = old_record(3, |r| r.gpu = Some(Gpu::Gpus(4)));
        for j in [share, mig, whole] {
            use prost::Message as _;
            let id = j.job.as_ref().unwrap().id;
            store.put_job_bytes(id, &j.encode_to_vec()).unwrap();
        }
        store.flush().await.unwrap();
    });
    let expect = |c: &Controller| {
        let gpu = |id| c.get_job(id).unwrap().spec.unwrap().resources.unwrap();
        let share = gpu(1);
        assert_eq!(
            share.gpu,
            Some(Gpu::Share(pb::GpuShare {
                compute_milli: 250,
                memory_mib: Some(4096)
            }))
        );
        assert_eq!(share.legacy_gpu_milli, 0);
        assert_eq!(
            gpu(2).gpu,
            Some(Gpu::Mig(pb::MigInstances {
                profile: "3g.40gb".into(),
                count: 2
            }))
        );
        assert_eq!(gpu(3).gpu, Some(Gpu::Gpus(4)));
    };
    rt.block_on(async {
        let c = Controller::open(
            Store::open(dir.path()).unwrap(),
            Config::default(),
            None,
            gpuctld::controller::PkiSetup::shared_key(ClusterKey::generate(), dir.path()),
        )
        .unwrap();
        expect(&c);
    });
    // Rewritten: read again, no record is in the older layout (the store upgrades and
    // names those that are), and each keeps its request.
    let store = Store::open(dir.path()).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.upgraded, Vec::<u64>::new());
    assert_eq!(loaded.jobs.len(), 3);
    assert!(
        loaded
            .jobs
            .iter()
            .all(|j| j.job.spec.resources.gpu.is_some())
    );
}
